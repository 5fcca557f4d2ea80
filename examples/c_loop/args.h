/* The command line of the C loop programs: counts given in digits, flags each program knows, and
 * a clear message with exit code 2 for anything else, before any training. */
#ifndef C_LOOP_ARGS_H
#define C_LOOP_ARGS_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each argument is a known flag, and a flag that takes a value has one. `valued` and `plain` end
 * with NULL. */
static inline void check_args(int argc, char** argv, const char* const* valued, const char* const* plain) {
  for (int i = 1; i < argc; ++i) {
    int known = 0;
    for (const char* const* f = valued; *f != NULL; ++f)
      if (strcmp(argv[i], *f) == 0) {
        if (i + 1 >= argc) {
          fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]);
          exit(2);
        }
        ++i;
        known = 1;
        break;
      }
    for (const char* const* f = plain; !known && *f != NULL; ++f)
      if (strcmp(argv[i], *f) == 0) known = 1;
    if (!known) {
      fprintf(stderr, "%s: unknown argument '%s'; the flags are", argv[0], argv[i]);
      for (const char* const* f = valued; *f != NULL; ++f) fprintf(stderr, " %s N", *f);
      for (const char* const* f = plain; *f != NULL; ++f) fprintf(stderr, " %s", *f);
      fprintf(stderr, "\n");
      exit(2);
    }
  }
}

/* A count from `lo` to `hi`: the flag's value, else the variable's, else `fallback`. */
static inline int count_option(int argc, char** argv, const char* flag, const char* variable, int fallback, int lo, int hi) {
  const char* text = NULL;
  const char* from = flag;
  for (int i = 1; i + 1 < argc; ++i)
    if (strcmp(argv[i], flag) == 0) text = argv[i + 1];
  if (text == NULL) {
    text = getenv(variable);
    from = variable;
    if (text == NULL || *text == '\0') return fallback;
  }
  char* end = NULL;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < lo || v > hi) {
    fprintf(stderr, "%s: %s is '%s'; give a whole number from %d to %d\n", argv[0], from, text, lo, hi);
    exit(2);
  }
  return (int)v;
}

#endif
