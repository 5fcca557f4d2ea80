/* The op wrapper and thunks of wrapped.c (calls.h). */
#include "calls.h"

#include <stdio.h>
#include <stdlib.h>

#include "layers.h"

enum { MAX_ARGS = 12 };

void check(spw_status status, const char* what) {
  if (status == SPW_OK) return;
  fprintf(stderr, "c_loop_wrapped: %s: %s error: %s\n", what, spw_status_name(status), spw_last_error());
  exit(1);
}

struct host_call {
  thunk fn;
  const arg* args;
  int n;
  const call_args* c;
};

static void on_host(const spw_host* h, void* user) {
  const struct host_call* hc = user;
  float* p[MAX_ARGS];
  for (int i = 0; i < hc->n; ++i) p[i] = spw_host_ptr(h, hc->args[i].t);
  hc->fn(p, hc->c);
}

/* The op's read, write and accumulate lists from the roles of its arguments. */
typedef struct op_lists {
  spw_tensor t[3][MAX_ARGS];
  size_t n[3];
} op_lists;
static void lists_of(const char* name, const arg* args, int n, op_lists* l) {
  if (n > MAX_ARGS) {
    fprintf(stderr, "c_loop_wrapped: %s: %d tensors, more than the %d a call may pass\n", name, n, MAX_ARGS);
    exit(1);
  }
  l->n[0] = l->n[1] = l->n[2] = 0;
  for (int i = 0; i < n; ++i) {
    if (args[i].role == RD || args[i].role == RW) l->t[0][l->n[0]++] = args[i].t;
    if (args[i].role == WR || args[i].role == RW) l->t[1][l->n[1]++] = args[i].t;
    if (args[i].role == AC) l->t[2][l->n[2]++] = args[i].t;
  }
}

void op_call(spw_session* s, const char* name, thunk fn, const arg* args, int n, const call_args* c) {
  op_lists l;
  lists_of(name, args, n, &l);
  spw_op* op;
  check(spw_op_begin(s, name, l.t[0], l.n[0], l.t[1], l.n[1], l.t[2], l.n[2], &op), name);
  struct host_call hc = {fn, args, n, c};
  check(spw_op_run(op, on_host, &hc), name);
  check(spw_op_end(op), name);
}

/* A call a body may make again later in the iteration (a rerun of a recomputable op) or on the
 * host: its arguments copied here, kept until the iteration ends (end_iteration). */
enum { MAX_KEPT = 1024 };
struct kept_call {
  struct host_call hc;
  arg args[MAX_ARGS];
  call_args c;
};
static struct kept_call kept[MAX_KEPT];
static int kept_count;

static struct kept_call* keep(const char* name, thunk fn, const arg* args, int n, const call_args* c) {
  if (kept_count == MAX_KEPT) {
    fprintf(stderr, "c_loop_wrapped: %s: more than %d kept calls in one iteration\n", name, MAX_KEPT);
    exit(1);
  }
  struct kept_call* k = &kept[kept_count++];
  for (int i = 0; i < n; ++i) k->args[i] = args[i];
  k->c = *c;
  k->hc = (struct host_call){fn, k->args, n, &k->c};
  return k;
}

static spw_status on_device(spw_op* op, void* user) { return spw_op_run(op, on_host, &((struct kept_call*)user)->hc); }
static void on_host_side(const spw_host* h, void* user) { on_host(h, &((struct kept_call*)user)->hc); }

void recomputable_call(spw_session* s, const char* name, thunk fn, const arg* args, int n, const call_args* c) {
  op_lists l;
  lists_of(name, args, n, &l);
  check(spw_recomputable_op(s, name, l.t[0], l.n[0], l.t[1], l.n[1], on_device, keep(name, fn, args, n, c), 0), name);
}

void host_capable_call(spw_session* s, const char* name, thunk fn, const arg* args, int n, const call_args* c) {
  op_lists l;
  lists_of(name, args, n, &l);
  check(spw_host_capable_op(s, name, l.t[0], l.n[0], l.t[1], l.n[1], on_device, on_host_side,
                            keep(name, fn, args, n, c), 0, 0),
        name);
}

spw_tensor transient(spw_session* s, const char* name, int layer, size_t floats, spw_kind kind) {
  char full[64];
  if (layer >= 0) snprintf(full, sizeof full, "h%d.%s", layer, name);
  else snprintf(full, sizeof full, "%s", name);
  spw_tensor t;
  check(spw_add_transient(s, full, floats * sizeof(float), kind, &t), full);
  return t;
}

void release(spw_session* s, spw_tensor t) { check(spw_release(s, t), "release"); }

/* Sums over the run, and the highest peak after the first iteration (which may run before the
 * budget is set: device_budget_ratio, --least-budget). */
static spw_iteration_report totals;
static uint64_t train_footprint; /* footprint of the first (train) iteration */

void end_iteration(spw_session* s) {
  spw_iteration_report r;
  check(spw_end_iteration(s, &r), "end_iteration");
  kept_count = 0; /* no rerun reaches past the iteration */
  const char* verbose = getenv("C_LOOP_REPORTS");
  if (verbose != NULL && *verbose != '\0' && *verbose != '0')
    fprintf(stderr, "iteration %llu planned %d policy %s peak %llu h2d %llu d2h %llu fetches %llu evictions %llu\n",
            (unsigned long long)r.iteration, r.planned, r.policy, (unsigned long long)r.peak_device_bytes,
            (unsigned long long)r.h2d_bytes, (unsigned long long)r.d2h_bytes,
            (unsigned long long)r.on_demand_fetches, (unsigned long long)r.on_demand_evictions);
  totals.iteration = r.iteration;
  if (r.iteration == 1) check(spw_footprint_bytes(s, &train_footprint), "footprint_bytes");
  if (r.iteration > 1 && r.peak_device_bytes > totals.peak_device_bytes) totals.peak_device_bytes = r.peak_device_bytes;
  totals.h2d_bytes += r.h2d_bytes, totals.d2h_bytes += r.d2h_bytes;
  totals.nvme_read_bytes += r.nvme_read_bytes, totals.nvme_write_bytes += r.nvme_write_bytes;
  totals.on_demand_fetches += r.on_demand_fetches, totals.on_demand_evictions += r.on_demand_evictions;
  totals.stall_ms += r.stall_ms, totals.step_ms += r.step_ms;
  totals.recomputes += r.recomputes, totals.host_ops += r.host_ops;
}

void summarize(spw_session* s, FILE* out) {
  uint64_t budget = 0, footprint = train_footprint, least = 0;
  check(spw_device_budget(s, &budget), "device_budget");
  check(spw_least_budget_bytes(s, &least), "least_budget_bytes");
  fprintf(out,
          "summary: iterations %llu budget %llu footprint %llu least %llu peak %llu h2d %llu d2h %llu nvme_read %llu "
          "nvme_write %llu on_demand_fetches %llu on_demand_evictions %llu recomputes %llu host_ops %llu time_ms %.1f\n",
          (unsigned long long)totals.iteration, (unsigned long long)budget, (unsigned long long)footprint,
          (unsigned long long)least, (unsigned long long)totals.peak_device_bytes,
          (unsigned long long)totals.h2d_bytes, (unsigned long long)totals.d2h_bytes,
          (unsigned long long)totals.nvme_read_bytes, (unsigned long long)totals.nvme_write_bytes,
          (unsigned long long)totals.on_demand_fetches, (unsigned long long)totals.on_demand_evictions,
          (unsigned long long)totals.recomputes, (unsigned long long)totals.host_ops, totals.step_ms);
}

void encoder_forward_t(float* const* p, const call_args* c) {
  encoder_forward(p[0], c->tokens, p[1], p[2], c->i[0], c->i[1], c->i[2]);
}
void layernorm_forward_t(float* const* p, const call_args* c) {
  layernorm_forward(p[0], p[1], p[2], p[3], p[4], p[5], c->i[0], c->i[1]);
}
void matmul_forward_t(float* const* p, const call_args* c) {
  matmul_forward(p[0], p[1], p[2], p[3], c->i[0], c->i[1], c->i[2]);
}
void matmul_forward_nobias_t(float* const* p, const call_args* c) {
  matmul_forward(p[0], p[1], p[2], NULL, c->i[0], c->i[1], c->i[2]);
}
void attention_forward_t(float* const* p, const call_args* c) {
  attention_forward(p[0], p[1], p[2], c->i[0], c->i[1], c->i[2], c->i[3]);
}
void residual_forward_t(float* const* p, const call_args* c) { residual_forward(p[0], p[1], p[2], c->i[0]); }
void gelu_forward_t(float* const* p, const call_args* c) { gelu_forward(p[0], p[1], c->i[0]); }
void crossentropy_forward_t(float* const* p, const call_args* c) {
  crossentropy_forward(p[0], p[1], p[2], c->tokens, c->i[0], c->i[1]);
}
void crossentropy_backward_t(float* const* p, const call_args* c) {
  crossentropy_backward(p[0], p[1], c->tokens, c->i[0], c->i[1]);
}
void matmul_backward_t(float* const* p, const call_args* c) {
  matmul_backward(p[0], p[1], p[2], p[3], p[4], p[5], c->i[0], c->i[1], c->i[2]);
}
void matmul_backward_nobias_t(float* const* p, const call_args* c) {
  matmul_backward(p[0], p[1], NULL, p[2], p[3], p[4], c->i[0], c->i[1], c->i[2]);
}
void layernorm_backward_t(float* const* p, const call_args* c) {
  layernorm_backward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], c->i[0], c->i[1]);
}
void gelu_backward_t(float* const* p, const call_args* c) { gelu_backward(p[0], p[1], p[2], c->i[0]); }
void residual_backward_t(float* const* p, const call_args* c) { residual_backward(p[0], p[1], c->i[0]); }
void attention_backward_t(float* const* p, const call_args* c) {
  attention_backward(p[0], p[1], p[2], p[3], c->i[0], c->i[1], c->i[2], c->i[3]);
}
void encoder_backward_t(float* const* p, const call_args* c) {
  encoder_backward(p[0], p[1], p[2], c->tokens, c->i[0], c->i[1], c->i[2]);
}
void adamw_update_t(float* const* p, const call_args* c) {
  adamw_update(p[0], p[1], p[2], p[3], (size_t)c->i[0], c->f[0], c->f[1], c->f[2], c->f[3], c->f[4], c->i[1]);
}
