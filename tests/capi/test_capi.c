/* The C API (capi/spillway.h) tested from C: `test_capi CASE` runs one case and exits 0 when it
 * passes; meson registers one test per case (tests/capi/meson.build), so each is counted. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capi/spillway.h"
#include "capi_check.h"

enum { N = 1024 }; /* floats per tensor: 4 KiB */
static const char* small_device = "{\"backend\": \"cpu\", \"cpu_device_memory\": \"16MiB\", \"policy\": \"auto\"}";

/* ---- host functions ---------------------------------------------------------------------- */

struct fill_args {
  spw_tensor t;
  float value;
};
static void fill(const spw_host* h, void* user) {
  const struct fill_args* a = user;
  float* p = spw_host_ptr(h, a->t);
  for (int i = 0; i < N; ++i) p[i] = a->value + (float)i;
}

/* y = w * x; g += y (g accumulates). */
struct axpy_args {
  spw_tensor w, x, y, g;
};
static void mul_acc(const spw_host* h, void* user) {
  const struct axpy_args* a = user;
  const float* w = spw_host_ptr(h, a->w);
  const float* x = spw_host_ptr(h, a->x);
  float* y = spw_host_ptr(h, a->y);
  float* g = spw_host_ptr(h, a->g);
  for (int i = 0; i < N; ++i) {
    y[i] = w[i] * x[i];
    g[i] += y[i];
  }
}

/* w -= 0.5 * g, in place. */
static void step(const spw_host* h, void* user) {
  const struct axpy_args* a = user;
  float* w = spw_host_ptr(h, a->w);
  const float* g = spw_host_ptr(h, a->g);
  for (int i = 0; i < N; ++i) w[i] -= 0.5f * g[i];
}

static void asks_for_unnamed(const spw_host* h, void* user) {
  const spw_tensor* t = user;
  if (spw_host_ptr(h, *t) != NULL) ++failures;
}


/* ---- cases --------------------------------------------------------------------------------- */

/* A session from JSON text; persistent tensors with contents; per iteration a transient input,
 * an op that reads, writes and accumulates, an in-place update, a host read of a metric. The
 * results are those of the same arithmetic done here, every iteration, planned or not. */
static void op_read_write_accumulate(void) {
  spw_session* s;
  OK(spw_session_from_json_text(small_device, &s));
  float init[N], want_w[N], got[N];
  for (int i = 0; i < N; ++i) want_w[i] = init[i] = 0.25f * (float)(i % 7);
  spw_tensor w, g;
  OK(spw_add_persistent(s, "w", sizeof init, SPW_PARAMETER, init, &w));
  OK(spw_add_persistent(s, "w.grad", sizeof init, SPW_GRADIENT, NULL, &g));
  for (int it = 1; it <= 4; ++it) {
    OK(spw_begin_iteration(s, "train"));
    spw_tensor x, y;
    OK(spw_add_transient(s, "x", sizeof got, SPW_ACTIVATION, &x));
    OK(spw_add_transient(s, "y", sizeof got, SPW_METRIC, &y));
    struct fill_args f = {x, (float)it};
    OK(run_op(s, "load.forward", NULL, 0, &x, 1, NULL, 0, fill, &f));
    struct axpy_args a = {w, x, y, g};
    spw_tensor reads[] = {w, x}, writes[] = {y}, accs[] = {g};
    OK(run_op(s, "mul.forward", reads, 2, writes, 1, accs, 1, mul_acc, &a));
    OK(spw_release(s, x));
    OK(spw_read(s, y, got, sizeof got));
    OK(spw_release(s, y));
    spw_tensor sreads[] = {w, g}, swrites[] = {w};
    OK(run_op(s, "sgd.step", sreads, 2, swrites, 1, NULL, 0, step, &a));
    spw_iteration_report r;
    OK(spw_end_iteration(s, &r));
    CHECK(r.iteration == (uint64_t)it);
    CHECK(r.planned == (it > 1));
    CHECK(it == 1 || strcmp(r.policy, "auto") == 0);
    CHECK(r.peak_device_bytes > 0);
    for (int i = 0; i < N; ++i) {
      const float y_i = want_w[i] * ((float)it + (float)i);
      CHECK(got[i] == y_i);
      want_w[i] -= 0.5f * y_i; /* the gradient starts from zero each iteration */
      if (failures) break;
    }
  }
  OK(spw_read(s, w, got, sizeof got));
  CHECK(memcmp(got, want_w, sizeof got) == 0);
  /* Weights replaced between iterations are what the next read gives. */
  for (int i = 0; i < N; ++i) want_w[i] = (float)i;
  OK(spw_write(s, w, want_w, sizeof want_w));
  OK(spw_read(s, w, got, sizeof got));
  CHECK(memcmp(got, want_w, sizeof got) == 0);
  FAILS(spw_write(s, w, want_w, 4), SPW_ERR_USAGE, "given 4 bytes");
  uint64_t budget = 0, footprint = 0, least = 0;
  OK(spw_device_budget(s, &budget));
  OK(spw_footprint_bytes(s, &footprint));
  OK(spw_least_budget_bytes(s, &least));
  CHECK(budget > 0 && footprint >= least && least > 0);
  spw_session_destroy(s);
}

/* Every failure is a code with a message, and nothing is left open after it. */
static void errors_are_codes_with_messages(void) {
  spw_session* s = (spw_session*)&failures; /* set to NULL on failure */
  FAILS(spw_session_from_json_text("{\"policy\": ", &s), SPW_ERR_CONFIG, "not valid JSON");
  CHECK(s == NULL);
  FAILS(spw_session_from_json_text("{\"polcy\": \"auto\"}", &s), SPW_ERR_CONFIG, "unknown setting");
  FAILS(spw_session_from_json_text("{\"policy\": \"greedy\"}", &s), SPW_ERR_CONFIG, "greedy");
  FAILS(spw_session_from_json_file("/nonexistent/spillway.json", &s), SPW_ERR_CONFIG, "/nonexistent/spillway.json");
  CHECK(strcmp(spw_status_name(SPW_ERR_OUT_OF_MEMORY), "out_of_memory") == 0);
  CHECK(strcmp(spw_status_name((spw_status)99), "unknown") == 0);
  /* From the environment: a bad value is refused naming the variable; good ones open a session. */
  setenv("SPILLWAY_POLICY", "greedy", 1);
  FAILS(spw_session_from_env(&s), SPW_ERR_CONFIG, "SPILLWAY_POLICY");
  setenv("SPILLWAY_POLICY", "lms", 1);
  setenv("SPILLWAY_BACKEND", "cpu", 1);
  setenv("SPILLWAY_CPU_DEVICE_MEMORY", "16MiB", 1);
  OK(spw_session_from_env(&s));
  uint64_t budget = 0;
  OK(spw_device_budget(s, &budget));
  CHECK(budget > 0 && budget <= 16u << 20);
  spw_session_destroy(s);
  unsetenv("SPILLWAY_POLICY"), unsetenv("SPILLWAY_BACKEND"), unsetenv("SPILLWAY_CPU_DEVICE_MEMORY");

  OK(spw_session_from_json_text(small_device, &s));
  float init[N] = {0};
  spw_tensor w, t;
  OK(spw_add_persistent(s, "w", sizeof init, SPW_PARAMETER, init, &w));
  FAILS(spw_add_persistent(s, "bad", sizeof init, (spw_kind)42, NULL, &t), SPW_ERR_USAGE, "not an spw_kind");
  FAILS(spw_add_persistent(s, "w", sizeof init, SPW_PARAMETER, NULL, &t), SPW_ERR_CONFIG, "registered twice");
  spw_op* op = (spw_op*)&failures;
  FAILS(spw_op_begin(s, "outside.forward", &w, 1, NULL, 0, NULL, 0, &op), SPW_ERR_USAGE, "outside.forward");
  CHECK(op == NULL);
  FAILS(spw_op_begin(NULL, "x", NULL, 0, NULL, 0, NULL, 0, &op), SPW_ERR_USAGE, "NULL");

  OK(spw_begin_iteration(s, NULL));
  spw_tensor unknown = {9999};
  FAILS(spw_op_begin(s, "unknown.forward", &unknown, 1, NULL, 0, NULL, 0, &op), SPW_ERR_USAGE, "");
  FAILS(spw_op_begin(s, "null.forward", NULL, 2, NULL, 0, NULL, 0, &op), SPW_ERR_USAGE, "reads is NULL");
  spw_tensor x;
  OK(spw_add_transient(s, "x", sizeof init, SPW_ACTIVATION, &x));
  FAILS(spw_read(s, x, init, sizeof init), SPW_ERR_USAGE, "\"x\"");  /* before any op wrote it */
  /* An op whose host function asks for a tensor it does not name. */
  struct fill_args f = {x, 1};
  OK(run_op(s, "x.forward", NULL, 0, &x, 1, NULL, 0, fill, &f));
  FAILS(run_op(s, "w.forward", &x, 1, NULL, 0, NULL, 0, asks_for_unnamed, &w), SPW_ERR_USAGE, "does not name");
  OK(spw_release(s, x));
  FAILS(spw_read(s, x, init, sizeof init), SPW_ERR_USAGE, "\"x\"");  /* after its release */
  FAILS(spw_add_view(s, w, 0, 16, "w.part", &t), SPW_ERR_USAGE, "inside an iteration");
  FAILS(spw_set_device_budget(s, 1 << 20), SPW_ERR_USAGE, "");
  OK(spw_end_iteration(s, NULL));
  FAILS(spw_end_iteration(s, NULL), SPW_ERR_USAGE, "");
  FAILS(spw_set_device_budget(s, 0), SPW_ERR_CONFIG, "");
  spw_session_destroy(s);
  spw_session_destroy(NULL);
}

/* A flat buffer with a view per layer: ops name the views, the parent reads back whole, and a
 * budget below the buffer's size still gives the same bytes. */
static void views_of_a_flat_buffer(void) {
  enum { layers = 4, per = N };
  spw_session* s;
  OK(spw_session_from_json_text(small_device, &s));
  float* flat = malloc(sizeof(float) * layers * per);
  float* back = malloc(sizeof(float) * layers * per);
  for (int i = 0; i < layers * per; ++i) flat[i] = (float)i;
  spw_tensor p, v[layers], bad;
  OK(spw_add_persistent(s, "flat", sizeof(float) * layers * per, SPW_PARAMETER, flat, &p));
  for (int l = 0; l < layers; ++l) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", l);
    OK(spw_add_view(s, p, sizeof(float) * (uint64_t)(l * per), sizeof(float) * per, l == 3 ? NULL : name, &v[l]));
  }
  FAILS(spw_add_view(s, p, 8, 16, "overlaps", &bad), SPW_ERR_CONFIG, "overlaps");
  FAILS(spw_add_view(s, p, 0, sizeof(float) * (layers * per + 1), "past", &bad), SPW_ERR_CONFIG, "outside");
  for (int it = 1; it <= 3; ++it) {
    if (it == 2) { /* after the first iteration: the least budget, below the buffer's size */
      uint64_t least = 0;
      OK(spw_least_budget_bytes(s, &least));
      CHECK(least > 0 && least < sizeof(float) * layers * per);
      OK(spw_set_device_budget(s, least));
    }
    OK(spw_begin_iteration(s, "train"));
    for (int l = 0; l < layers; ++l) {
      struct axpy_args a = {v[l], v[l], v[l], v[l]};
      spw_tensor g;
      char name[32];
      snprintf(name, sizeof name, "layer%d.g", l);
      OK(spw_add_transient(s, name, sizeof(float) * per, SPW_ACTIVATION, &g));
      a.g = g;
      struct fill_args f = {g, 2.0f};
      OK(run_op(s, "g.forward", NULL, 0, &g, 1, NULL, 0, fill, &f));
      spw_tensor reads[] = {v[l], g};
      OK(run_op(s, "sgd.step", reads, 2, &v[l], 1, NULL, 0, step, &a));
      OK(spw_release(s, g));
    }
    OK(spw_end_iteration(s, NULL));
  }
  OK(spw_read(s, p, back, sizeof(float) * layers * per));
  for (int i = 0; i < layers * per; ++i) {
    const float g = 2.0f + (float)(i % per);
    float want = (float)i;
    for (int it = 0; it < 3; ++it) want -= 0.5f * g;
    CHECK(back[i] == want);
    if (failures) break;
  }
  free(flat);
  free(back);
  spw_session_destroy(s);
}

/* Device pointers, the stream and scratch of an op. */
static void op_pointers_stream_workspace(void) {
  spw_session* s;
  OK(spw_session_from_json_text(small_device, &s));
  float init[N] = {0};
  spw_tensor w;
  OK(spw_add_persistent(s, "w", sizeof init, SPW_PARAMETER, init, &w));
  OK(spw_begin_iteration(s, "train"));
  spw_op* op;
  OK(spw_op_begin(s, "w.forward", &w, 1, NULL, 0, NULL, 0, &op));
  void* p = NULL;
  void* scratch = NULL;
  CHECK(spw_op_ptr(op, w, &p) == SPW_OK && p != NULL);
  spw_tensor unknown = {777};
  CHECK(spw_op_ptr(op, unknown, &p) == SPW_ERR_USAGE);
  CHECK(spw_op_stream(op) != NULL);
  CHECK(spw_op_stream(op) == spw_session_stream(s));
  CHECK(spw_session_stream(NULL) == NULL);
  CHECK(spw_op_workspace(op, 4096, &scratch) == SPW_OK && scratch != NULL);
  OK(spw_op_end(op));
  OK(spw_end_iteration(s, NULL));
  spw_session_destroy(s);
}

/* Ends the op from inside its own spw_op_run function: refused (it used to hang). */
struct end_inside_args {
  spw_op* op;
  spw_status got;
};
static void end_inside(const spw_host* h, void* user) {
  (void)h;
  struct end_inside_args* a = user;
  a->got = spw_op_end(a->op);
}

/* An op ended twice, or used after its end, is refused (Note [Live ops]); before, the second end
 * freed whatever block the program had been given since. An op left open when its step was given
 * up ends nothing when ended later: not the next step's op, which has the same index. */
static void ended_and_stale_ops_are_refused_or_inert(void) {
  spw_session* s;
  OK(spw_session_from_json_text(small_device, &s));
  float init[N] = {0};
  spw_tensor w, x;
  OK(spw_add_persistent(s, "w", sizeof init, SPW_PARAMETER, init, &w));
  OK(spw_begin_iteration(s, "train"));
  spw_op* op;
  OK(spw_op_begin(s, "w.forward", &w, 1, NULL, 0, NULL, 0, &op));
  OK(spw_op_end(op));
  FAILS(spw_op_end(op), SPW_ERR_USAGE, "the op has ended");
  void* p = NULL;
  FAILS(spw_op_ptr(op, w, &p), SPW_ERR_USAGE, "the op has ended");
  FAILS(spw_op_workspace(op, 64, &p), SPW_ERR_USAGE, "the op has ended");
  CHECK(spw_op_stream(op) == NULL);
  /* An op begun since must not be taken for the ended one, though the allocator would give it
   * the ended one's block. */
  spw_op* next;
  OK(spw_op_begin(s, "w.forward2", &w, 1, NULL, 0, NULL, 0, &next));
  CHECK(next != op);
  FAILS(spw_op_end(op), SPW_ERR_USAGE, "the op has ended");
  OK(spw_op_ptr(next, w, &p));
  OK(spw_op_end(next));
  OK(spw_end_iteration(s, NULL));

  OK(spw_begin_iteration(s, "train"));
  spw_op* stale;
  OK(spw_op_begin(s, "w.forward", &w, 1, NULL, 0, NULL, 0, &stale));
  OK(spw_abandon_iteration(s));
  OK(spw_begin_iteration(s, "train"));
  OK(spw_add_transient(s, "x", sizeof init, SPW_ACTIVATION, &x));
  spw_op* fresh;
  OK(spw_op_begin(s, "x.forward", NULL, 0, &x, 1, NULL, 0, &fresh));
  OK(spw_op_end(stale)); /* frees it; the open op stays open */
  void* px = NULL;
  OK(spw_op_ptr(fresh, x, &px));
  CHECK(px != NULL);
  struct fill_args fx = {x, 1.0f};
  OK(spw_op_run(fresh, fill, &fx)); /* before, the stale end had closed it: "whose scope has ended" */
  struct end_inside_args ei = {fresh, SPW_OK};
  OK(spw_op_run(fresh, end_inside, &ei));
  CHECK(ei.got == SPW_ERR_USAGE);
  OK(spw_release(s, x)); /* inside the op: freed once its work is done */
  void* gone = NULL;
  FAILS(spw_op_ptr(fresh, x, &gone), SPW_ERR_USAGE, "released inside the op");
  OK(spw_op_end(fresh));
  OK(spw_end_iteration(s, NULL));
  spw_session_destroy(s);
}

/* g += x (g accumulates). */
struct add_args {
  spw_tensor x, g;
};
static void add_into(const spw_host* h, void* user) {
  const struct add_args* a = user;
  const float* x = spw_host_ptr(h, a->x);
  float* g = spw_host_ptr(h, a->g);
  for (int i = 0; i < N; ++i) g[i] += x[i];
}

/* A step the loop gives up between ops, on an error of its own: beginning the next step without
 * ending it is a usage error that names spw_abandon_iteration, which ends it. The weight holds its
 * value from before the step, or the step's update when the loop gave up after it; the next step
 * runs on the plan of the whole ones. */
static void a_step_the_loop_gives_up_is_abandoned(void) {
  spw_session* s;
  OK(spw_session_from_json_text(small_device, &s));
  float init[N], got[N];
  for (int i = 0; i < N; ++i) init[i] = (float)i;
  spw_tensor w, g;
  OK(spw_add_persistent(s, "w", sizeof init, SPW_PARAMETER, init, &w));
  OK(spw_add_persistent(s, "w.grad", sizeof init, SPW_GRADIENT, NULL, &g));
  int updates = 0;
  for (int it = 0; it < 5; ++it) {
    if (it == 3) FAILS(spw_begin_iteration(s, "train"), SPW_ERR_USAGE, "abandon_iteration");
    if (it == 3) OK(spw_abandon_iteration(s));
    OK(spw_begin_iteration(s, "train"));
    spw_tensor x;
    OK(spw_add_transient(s, "x", sizeof init, SPW_ACTIVATION, &x));
    struct fill_args fx = {x, 1.0f}; /* x[i] = 1 + i */
    OK(run_op(s, "x.forward", NULL, 0, &x, 1, NULL, 0, fill, &fx));
    struct add_args ga = {x, g};
    OK(run_op(s, "w.backward", &x, 1, NULL, 0, &g, 1, add_into, &ga));
    if (it == 2) continue; /* gives up before the update; the next begin says so */
    struct axpy_args sa = {w, x, x, g};
    spw_tensor rw[] = {w, g};
    OK(run_op(s, "w.step", rw, 2, &w, 1, NULL, 0, step, &sa)); /* w -= 0.5 g */
    ++updates;
    if (it == 3) { /* gives up after the update */
      OK(spw_abandon_iteration(s));
      OK(spw_abandon_iteration(s)); /* none open: nothing to do */
      continue;
    }
    OK(spw_release(s, x));
    spw_iteration_report r;
    OK(spw_end_iteration(s, &r));
    if (it == 4) CHECK(r.planned == 1);
  }
  CHECK(updates == 4);
  OK(spw_read(s, w, got, sizeof got));
  int wrong = 0;
  for (int i = 0; i < N; ++i) wrong += got[i] != (float)i - 0.5f * (float)updates * (float)(1 + i);
  CHECK(wrong == 0);
  spw_session_destroy(s);
}

/* A checkpoint written from C and read back into a session, with the loop's meta. */
static void checkpoint_round_trip(void) {
  char dir[] = "/tmp/spw-capi-XXXXXX";
  if (mkdtemp(dir) == NULL) {
    ++failures;
    return;
  }
  float a[N], b[N], got[N];
  for (int i = 0; i < N; ++i) a[i] = (float)i, b[i] = -1.0f;
  spw_session* s;
  OK(spw_session_from_json_text(small_device, &s));
  spw_tensor w;
  OK(spw_add_persistent(s, "w", sizeof a, SPW_PARAMETER, a, &w));
  OK(spw_save(s, dir, "step=7", 6));
  spw_session_destroy(s);

  OK(spw_session_from_json_text(small_device, &s));
  OK(spw_add_persistent(s, "w", sizeof b, SPW_PARAMETER, b, &w));
  char meta[4];
  size_t len = 0;
  OK(spw_load(s, dir, meta, sizeof meta, &len));
  CHECK(len == 6 && memcmp(meta, "step", 4) == 0);
  OK(spw_read(s, w, got, sizeof got));
  CHECK(memcmp(got, a, sizeof got) == 0);
  spw_session_destroy(s);

  OK(spw_session_from_json_text(small_device, &s));
  OK(spw_add_persistent(s, "other", sizeof b, SPW_PARAMETER, b, &w));
  CHECK(spw_load(s, dir, NULL, 0, NULL) != SPW_OK && strlen(spw_last_error()) > 0);
  spw_session_destroy(s);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

static const capi_case cases[] = {
    {"op_read_write_accumulate", op_read_write_accumulate},
    {"errors_are_codes_with_messages", errors_are_codes_with_messages},
    {"views_of_a_flat_buffer", views_of_a_flat_buffer},
    {"op_pointers_stream_workspace", op_pointers_stream_workspace},
    {"checkpoint_round_trip", checkpoint_round_trip},
    {"a_step_the_loop_gives_up_is_abandoned", a_step_the_loop_gives_up_is_abandoned},
    {"ended_and_stale_ops_are_refused_or_inert", ended_and_stale_ops_are_refused_or_inert},
};

int main(int argc, char** argv) { return run_case(cases, sizeof cases / sizeof cases[0], argc, argv); }
