/* The layers of a small GPT in plain C: functions over float arrays, as a loop written without
 * offload in mind has them. Both c_loop programs compile this one file (plain.c and wrapped.c).
 * Every backward function adds into its outputs (+=), so gradients start from zero each step. */
#ifndef C_LOOP_LAYERS_H
#define C_LOOP_LAYERS_H

#include <stddef.h>
#include <stdint.h>

/* Sizes of the model and its batches. */
typedef struct gpt_config {
  int vocab, layers, channels, heads, seq, batch;
} gpt_config;

/* The tensors of one transformer block, in the order they lie in the flat parameter buffer. */
enum {
  P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_PROJW, P_PROJB,
  P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB,
  P_PER_LAYER
};
enum { MAX_LAYERS = 8 };

/* The parameter tensors, numbered: wte, wpe, each layer's P_PER_LAYER, then the final norm's. */
enum { WTE = 0, WPE = 1, MAX_TENSORS = 4 + MAX_LAYERS * P_PER_LAYER };
#define LW(l, k) (2 + (l) * P_PER_LAYER + (k)) /* tensor k of layer l */
#define LNFW(cfg) (2 + (cfg)->layers * P_PER_LAYER)
#define LNFB(cfg) (3 + (cfg)->layers * P_PER_LAYER)

/* Where each parameter tensor starts in the flat buffer (in floats), and how many floats it has. */
typedef struct gpt_layout {
  int tensors;
  size_t offset[MAX_TENSORS], count[MAX_TENSORS];
  char name[MAX_TENSORS][32];
  size_t total;
} gpt_layout;
void gpt_layout_init(gpt_layout* lay, const gpt_config* cfg);

/* Deterministic numbers: a 64-bit LCG. */
uint32_t lcg_next(uint64_t* state);
float lcg_uniform(uint64_t* state); /* in [-1, 1) */

/* Synthetic text: `n` tokens below `vocab` from a fixed LCG, with structure to learn. */
void make_text(int* text, int n, int vocab);
/* The batch at `position` of a text: inputs and the next tokens as targets (batch x seq each). */
void get_batch(const int* text, int text_n, int position, int batch, int seq, int* inputs, int* targets);
/* Initial parameters (the flat buffer, laid out by `lay`). */
void gpt_init_params(float* params, const gpt_layout* lay, const gpt_config* cfg, uint64_t seed);

/* ---- forward ---------------------------------------------------------------------------------- */
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N, int C);
/* out[N, OC] = inp[N, C] @ w[OC, C]^T + bias[OC] (bias may be NULL). */
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC);
/* Causal self-attention over qkv[B, T, 3C]; att[B, NH, T, T] keeps the softmax for backward. */
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void residual_forward(float* out, const float* a, const float* b, int N);
void gelu_forward(float* out, const float* inp, int N);
/* Softmax cross-entropy per position: losses[N] from logits[N, V] and targets[N]. */
void crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets, int N, int V);
/* The mean of the losses, on the host. */
float mean_loss(const float* losses, int N);

/* ---- backward (each adds into d* outputs) -------------------------------------------------- */
void crossentropy_backward(float* dlogits, const float* probs, const int* targets, int N, int V);
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int N, int C, int OC);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);
void gelu_backward(float* dinp, const float* inp, const float* dout, int N);
void residual_backward(float* dinp, const float* dout, int N);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C);

/* ---- optimizer ------------------------------------------------------------------------------- */
/* AdamW over `n` floats, step `t` (1-based); elementwise, so over a flat buffer or per tensor alike. */
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t);

#endif
