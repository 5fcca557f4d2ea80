/* How wrapped.c calls a layer function inside a Spillway op: the tensors it passes, each with its
 * role (read, written, both, accumulated), make the op's lists; inside spw_op_run their host
 * pointers, in the same order, go to a thunk that calls the unchanged function of layers.c. */
#ifndef C_LOOP_CALLS_H
#define C_LOOP_CALLS_H

#include <stdio.h>

#include <capi/spillway.h>

enum { RD, WR, RW, AC };
typedef struct arg {
  spw_tensor t;
  int role;
} arg;
#define R(t) {(t), RD}
#define W(t) {(t), WR}
#define RW(t) {(t), RW}
#define A(t) {(t), AC}
/* The tensors of a call: a compound literal and its length. */
#define ARGS(...) (const arg[]){__VA_ARGS__}, (int)(sizeof((const arg[]){__VA_ARGS__}) / sizeof(arg))

/* What a layer function takes besides float arrays. */
typedef struct call_args {
  const int* tokens;
  int i[4];
  float f[5];
} call_args;
#define INTS(...) &(const call_args){.i = {__VA_ARGS__}}
#define TOKENS(tok, ...) &(const call_args){.tokens = (tok), .i = {__VA_ARGS__}}

typedef void (*thunk)(float* const* p, const call_args* c);

/* Exits with the error's message when a call fails (this is an example program). */
void check(spw_status status, const char* what);
/* One op named `name` over `args`, running `fn` on their host pointers. */
void op_call(spw_session* s, const char* name, thunk fn, const arg* args, int n, const call_args* c);
/* The same as a recomputable op (a forward call: it only reads some tensors and writes others),
 * which the plan may run again in the iteration instead of keeping what it wrote. */
void recomputable_call(spw_session* s, const char* name, thunk fn, const arg* args, int n, const call_args* c);
/* The same as a host-capable op (the optimizer's step), which the plan may run on the host. */
void host_capable_call(spw_session* s, const char* name, thunk fn, const arg* args, int n, const call_args* c);
spw_tensor transient(spw_session* s, const char* name, int layer, size_t floats, spw_kind kind);
void release(spw_session* s, spw_tensor t);
/* spw_end_iteration, keeping the report's figures for summarize(). */
void end_iteration(spw_session* s);
/* One line to `out`: budget, the first iteration's footprint, least budget, peak and bytes moved over the run. */
void summarize(spw_session* s, FILE* out);

/* The thunks: one per layer function of layers.h, passing p[] in the function's order. */
void encoder_forward_t(float* const* p, const call_args* c);
void layernorm_forward_t(float* const* p, const call_args* c);
void matmul_forward_t(float* const* p, const call_args* c);
void matmul_forward_nobias_t(float* const* p, const call_args* c);
void attention_forward_t(float* const* p, const call_args* c);
void residual_forward_t(float* const* p, const call_args* c);
void gelu_forward_t(float* const* p, const call_args* c);
void crossentropy_forward_t(float* const* p, const call_args* c);
void crossentropy_backward_t(float* const* p, const call_args* c);
void matmul_backward_t(float* const* p, const call_args* c);
void matmul_backward_nobias_t(float* const* p, const call_args* c);
void layernorm_backward_t(float* const* p, const call_args* c);
void gelu_backward_t(float* const* p, const call_args* c);
void residual_backward_t(float* const* p, const call_args* c);
void attention_backward_t(float* const* p, const call_args* c);
void encoder_backward_t(float* const* p, const call_args* c);
void adamw_update_t(float* const* p, const call_args* c);

#endif
