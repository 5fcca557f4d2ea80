/* A training loop in C built out of tree against an installed Spillway (tests/install/run): only
 * the installed C header and library, through `pkg-config --cflags --libs spillway`, with cc.
 * Four weights of 256 KiB under a 1 MiB device budget, so the Session must swap; each iteration
 * adds 1 to every weight inside a host run and sums them into an accumulated metric. */
#include <capi/spillway.h>

#include <stdio.h>
#include <string.h>

enum { N = 64 * 1024, LAYERS = 4, ITERATIONS = 3 };

struct add_args {
  spw_tensor w, acc;
};

static void add_one(const spw_host* h, void* user) {
  const struct add_args* a = user;
  float* w = spw_host_ptr(h, a->w);
  float* acc = spw_host_ptr(h, a->acc);
  for (int k = 0; k < N; ++k) acc[k] += (w[k] += 1.0f);
}

static int failed(spw_status st, const char* what) {
  if (st == SPW_OK) return 0;
  printf("my_loop.c: FAILED: %s: %s: %s\n", what, spw_status_name(st), spw_last_error());
  return 1;
}

int main(void) {
  static float init[N], sum[N];
  spw_session* s;
  if (failed(spw_session_from_json_text("{\"backend\": \"cpu\", \"cpu_device_memory\": \"64MiB\", "
                                        "\"device_budget\": \"1MiB\", \"policy\": \"auto\"}", &s), "session"))
    return 1;
  spw_tensor w[LAYERS];
  for (int i = 0; i < LAYERS; ++i) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    for (int k = 0; k < N; ++k) init[k] = (float)(i + 1);
    if (failed(spw_add_persistent(s, name, sizeof init, SPW_PARAMETER, init, &w[i]), "add_persistent")) return 1;
  }
  unsigned long long moved = 0;
  for (int it = 1; it <= ITERATIONS; ++it) {
    spw_tensor acc;
    if (failed(spw_begin_iteration(s, "train"), "begin_iteration") ||
        failed(spw_add_transient(s, "acc", sizeof sum, SPW_METRIC, &acc), "add_transient"))
      return 1;
    for (int i = 0; i < LAYERS; ++i) {
      spw_op* op;
      struct add_args a = {w[i], acc};
      if (failed(spw_op_begin(s, "layer.forward", &w[i], 1, &w[i], 1, &acc, 1, &op), "op_begin")) return 1;
      const spw_status run = spw_op_run(op, add_one, &a);
      if (failed(spw_op_end(op), "op_end") || failed(run, "op_run")) return 1;
    }
    spw_iteration_report r;
    if (failed(spw_read(s, acc, sum, sizeof sum), "read") || failed(spw_release(s, acc), "release") ||
        failed(spw_end_iteration(s, &r), "end_iteration"))
      return 1;
    moved += r.h2d_bytes + r.d2h_bytes;
    const float want = (float)(LAYERS * (LAYERS + 1) / 2 + LAYERS * it);
    for (int k = 0; k < N; ++k)
      if (sum[k] != want) {
        printf("my_loop.c: FAILED: iteration %d, sum[%d] = %g, want %g\n", it, k, (double)sum[k], (double)want);
        return 1;
      }
  }
  spw_session_destroy(s);
  if (moved == 0) {
    printf("my_loop.c: FAILED: nothing was swapped under a budget below the tensors' size\n");
    return 1;
  }
  printf("my_loop.c: ok (%d iterations, %llu bytes swapped)\n", ITERATIONS, moved);
  return 0;
}
