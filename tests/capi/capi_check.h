/* The checks and the case runner of the C API's tests, written in C: each program is a list of
 * cases, `PROGRAM CASE` runs one and exits 0 when it passes (meson registers one test per case). */
#ifndef SPILLWAY_TESTS_CAPI_CHECK_H
#define SPILLWAY_TESTS_CAPI_CHECK_H

#include <stdio.h>
#include <string.h>

#include "capi/spillway.h"

static int failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, #cond, \
              spw_last_error());                                                              \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)
/* A call that must succeed; the case stops when it does not. */
#define OK(call)                                                                                         \
  do {                                                                                                   \
    spw_status st_ = (call);                                                                             \
    if (st_ != SPW_OK) {                                                                                 \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, spw_status_name(st_), \
              spw_last_error());                                                                         \
      ++failures;                                                                                        \
      return;                                                                                            \
    }                                                                                                    \
  } while (0)
/* A call that must fail with `code` and a message that contains `part`. */
#define FAILS(call, code, part)                                                                               \
  do {                                                                                                        \
    spw_status st_ = (call);                                                                                  \
    if (st_ != (code) || spw_last_status() != (code) || strstr(spw_last_error(), (part)) == NULL) {           \
      fprintf(stderr, "%s:%d: %s returned %s (\"%s\"), want %s with \"%s\"\n", __FILE__, __LINE__, #call,     \
              spw_status_name(st_), spw_last_error(), spw_status_name(code), (part));                          \
      ++failures;                                                                                             \
    }                                                                                                         \
  } while (0)

/* One op over the lists, running `fn` on the host; the first failure's status. */
static spw_status run_op(spw_session* s, const char* name, const spw_tensor* r, size_t nr, const spw_tensor* w,
                         size_t nw, const spw_tensor* acc, size_t na, void (*fn)(const spw_host*, void*), void* user) {
  spw_op* op;
  spw_status st = spw_op_begin(s, name, r, nr, w, nw, acc, na, &op);
  if (st != SPW_OK) return st;
  st = spw_op_run(op, fn, user);
  spw_status end = spw_op_end(op);
  return st != SPW_OK ? st : end;
}

typedef struct capi_case {
  const char* name;
  void (*run)(void);
} capi_case;

static int run_case(const capi_case* cases, size_t n, int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CASE (cases:", argv[0]);
    for (size_t i = 0; i < n; ++i) fprintf(stderr, " %s", cases[i].name);
    fprintf(stderr, ")\n");
    return 2;
  }
  for (size_t i = 0; i < n; ++i) {
    if (strcmp(argv[1], cases[i].name) != 0) continue;
    cases[i].run();
    printf("%s: %s\n", cases[i].name, failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
  }
  fprintf(stderr, "%s: no case %s\n", argv[0], argv[1]);
  return 2;
}

#endif
