/* c_loop_plain: a small GPT trained in plain C, written the way such loops are when nobody plans
 * for offload: flat parameter, gradient and AdamW buffers with offsets per tensor, flat
 * activations, gradients zeroed with memset at the start of each step. wrapped.c is this file
 * with each layer call wrapped in a Spillway op; the layers themselves are layers.c.
 * Usage: c_loop_plain [--steps N] [--eval-every N] (or C_LOOP_STEPS, C_LOOP_EVAL_EVERY). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "layers.h"

static const gpt_config cfg = {.vocab = 64, .layers = 2, .channels = 32, .heads = 2, .seq = 16, .batch = 4};
static const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
enum { TEXT_TOKENS = 4096, TRAIN_TOKENS = 3072, EVAL_BATCHES = 2 };

/* The activations of one block; `out` is the next block's input. */
typedef struct layer_acts {
  float *ln1, *mean1, *rstd1, *qkv, *att, *atty, *proj, *x2, *ln2, *mean2, *rstd2, *fc, *gelu, *fcproj, *out;
} layer_acts;
/* The activations of the model (and, in a second copy, their gradients). */
typedef struct acts {
  float* enc;
  layer_acts l[MAX_LAYERS];
  float *lnf, *meanf, *rstdf, *logits, *probs, *losses;
} acts;

typedef struct model {
  gpt_layout lay;
  float *params, *grads, *m, *v;             /* flat buffers of lay.total floats */
  float *p[MAX_TENSORS], *g[MAX_TENSORS];    /* each parameter tensor and its gradient, in them */
  float *act_memory, *dact_memory;           /* flat activations and their gradients */
  size_t act_floats;
  acts a, d;
} model;

static float* carve(float* base, size_t* at, size_t n) {
  float* p = base == NULL ? NULL : base + *at;
  *at += n;
  return p;
}

/* Lays the activations out in `base` (NULL: only counts them); returns their floats. */
static size_t layout_acts(acts* a, float* base) {
  const size_t B = (size_t)cfg.batch, T = (size_t)cfg.seq, C = (size_t)cfg.channels, V = (size_t)cfg.vocab;
  const size_t BT = B * T, NH = (size_t)cfg.heads;
  size_t at = 0;
  a->enc = carve(base, &at, BT * C);
  for (int l = 0; l < cfg.layers; ++l) {
    layer_acts* y = &a->l[l];
    y->ln1 = carve(base, &at, BT * C), y->mean1 = carve(base, &at, BT), y->rstd1 = carve(base, &at, BT);
    y->qkv = carve(base, &at, BT * 3 * C), y->att = carve(base, &at, B * NH * T * T);
    y->atty = carve(base, &at, BT * C), y->proj = carve(base, &at, BT * C), y->x2 = carve(base, &at, BT * C);
    y->ln2 = carve(base, &at, BT * C), y->mean2 = carve(base, &at, BT), y->rstd2 = carve(base, &at, BT);
    y->fc = carve(base, &at, BT * 4 * C), y->gelu = carve(base, &at, BT * 4 * C);
    y->fcproj = carve(base, &at, BT * C), y->out = carve(base, &at, BT * C);
  }
  a->lnf = carve(base, &at, BT * C), a->meanf = carve(base, &at, BT), a->rstdf = carve(base, &at, BT);
  a->logits = carve(base, &at, BT * V), a->probs = carve(base, &at, BT * V), a->losses = carve(base, &at, BT);
  return at;
}

static void model_init(model* M) {
  gpt_layout_init(&M->lay, &cfg);
  const size_t bytes = M->lay.total * sizeof(float);
  M->params = malloc(bytes), M->grads = malloc(bytes), M->m = calloc(1, bytes), M->v = calloc(1, bytes);
  gpt_init_params(M->params, &M->lay, &cfg, 1234);
  for (int t = 0; t < M->lay.tensors; ++t) {
    M->p[t] = M->params + M->lay.offset[t];
    M->g[t] = M->grads + M->lay.offset[t];
  }
  M->act_floats = layout_acts(&M->a, NULL);
  M->act_memory = malloc(M->act_floats * sizeof(float));
  M->dact_memory = malloc(M->act_floats * sizeof(float));
  layout_acts(&M->a, M->act_memory);
  layout_acts(&M->d, M->dact_memory);
}

static void model_free(model* M) {
  free(M->params), free(M->grads), free(M->m), free(M->v), free(M->act_memory), free(M->dact_memory);
}

/* The forward pass; returns the mean loss. */
static float forward(model* M, const int* inputs, const int* targets) {
  const int B = cfg.batch, T = cfg.seq, C = cfg.channels, V = cfg.vocab, NH = cfg.heads, BT = B * T;
  acts* a = &M->a;
  float* const* p = M->p;
  encoder_forward(a->enc, inputs, p[WTE], p[WPE], B, T, C);
  for (int l = 0; l < cfg.layers; ++l) {
    layer_acts* y = &a->l[l];
    const float* x = l == 0 ? a->enc : a->l[l - 1].out;
    layernorm_forward(y->ln1, y->mean1, y->rstd1, x, p[LW(l, P_LN1W)], p[LW(l, P_LN1B)], BT, C);
    matmul_forward(y->qkv, y->ln1, p[LW(l, P_QKVW)], p[LW(l, P_QKVB)], BT, C, 3 * C);
    attention_forward(y->atty, y->att, y->qkv, B, T, C, NH);
    matmul_forward(y->proj, y->atty, p[LW(l, P_PROJW)], p[LW(l, P_PROJB)], BT, C, C);
    residual_forward(y->x2, x, y->proj, BT * C);
    layernorm_forward(y->ln2, y->mean2, y->rstd2, y->x2, p[LW(l, P_LN2W)], p[LW(l, P_LN2B)], BT, C);
    matmul_forward(y->fc, y->ln2, p[LW(l, P_FCW)], p[LW(l, P_FCB)], BT, C, 4 * C);
    gelu_forward(y->gelu, y->fc, BT * 4 * C);
    matmul_forward(y->fcproj, y->gelu, p[LW(l, P_FCPROJW)], p[LW(l, P_FCPROJB)], BT, 4 * C, C);
    residual_forward(y->out, y->x2, y->fcproj, BT * C);
  }
  const float* last = a->l[cfg.layers - 1].out;
  layernorm_forward(a->lnf, a->meanf, a->rstdf, last, p[LNFW(&cfg)], p[LNFB(&cfg)], BT, C);
  matmul_forward(a->logits, a->lnf, p[WTE], NULL, BT, C, V);
  crossentropy_forward(a->losses, a->probs, a->logits, targets, BT, V);
  return mean_loss(a->losses, BT);
}

/* The backward pass: adds into the gradients and the activations' gradients. */
static void backward(model* M, const int* inputs, const int* targets) {
  const int B = cfg.batch, T = cfg.seq, C = cfg.channels, V = cfg.vocab, NH = cfg.heads, BT = B * T;
  const int L = cfg.layers;
  acts *a = &M->a, *d = &M->d;
  float *const *p = M->p, *const *g = M->g;
  crossentropy_backward(d->logits, a->probs, targets, BT, V);
  matmul_backward(d->lnf, g[WTE], NULL, d->logits, a->lnf, p[WTE], BT, C, V);
  layernorm_backward(d->l[L - 1].out, g[LNFW(&cfg)], g[LNFB(&cfg)], d->lnf, a->l[L - 1].out, p[LNFW(&cfg)], a->meanf, a->rstdf, BT, C);
  for (int l = L - 1; l >= 0; --l) {
    const layer_acts* y = &a->l[l];
    layer_acts* dy = &d->l[l];
    const float* x = l == 0 ? a->enc : a->l[l - 1].out;
    float* dx = l == 0 ? d->enc : d->l[l - 1].out;
    matmul_backward(dy->gelu, g[LW(l, P_FCPROJW)], g[LW(l, P_FCPROJB)], dy->out, y->gelu, p[LW(l, P_FCPROJW)], BT, 4 * C, C);
    gelu_backward(dy->fc, y->fc, dy->gelu, BT * 4 * C);
    matmul_backward(dy->ln2, g[LW(l, P_FCW)], g[LW(l, P_FCB)], dy->fc, y->ln2, p[LW(l, P_FCW)], BT, C, 4 * C);
    layernorm_backward(dy->x2, g[LW(l, P_LN2W)], g[LW(l, P_LN2B)], dy->ln2, y->x2, p[LW(l, P_LN2W)], y->mean2, y->rstd2, BT, C);
    residual_backward(dy->x2, dy->out, BT * C);
    matmul_backward(dy->atty, g[LW(l, P_PROJW)], g[LW(l, P_PROJB)], dy->x2, y->atty, p[LW(l, P_PROJW)], BT, C, C);
    attention_backward(dy->qkv, dy->atty, y->qkv, y->att, B, T, C, NH);
    matmul_backward(dy->ln1, g[LW(l, P_QKVW)], g[LW(l, P_QKVB)], dy->qkv, y->ln1, p[LW(l, P_QKVW)], BT, C, 3 * C);
    layernorm_backward(dx, g[LW(l, P_LN1W)], g[LW(l, P_LN1B)], dy->ln1, x, p[LW(l, P_LN1W)], y->mean1, y->rstd1, BT, C);
    residual_backward(dx, dy->x2, BT * C);
  }
  encoder_backward(g[WTE], g[WPE], d->enc, inputs, B, T, C);
}

static float train_step(model* M, const int* inputs, const int* targets, int step) {
  memset(M->grads, 0, M->lay.total * sizeof(float));
  memset(M->dact_memory, 0, M->act_floats * sizeof(float));
  const float loss = forward(M, inputs, targets);
  backward(M, inputs, targets);
  adamw_update(M->params, M->grads, M->m, M->v, M->lay.total, lr, beta1, beta2, eps, weight_decay, step);
  return loss;
}

static float eval_loss(model* M, const int* text, int* inputs, int* targets) {
  float sum = 0.0f;
  for (int i = 0; i < EVAL_BATCHES; ++i) {
    get_batch(text + TRAIN_TOKENS, TEXT_TOKENS - TRAIN_TOKENS, i * cfg.batch * cfg.seq, cfg.batch, cfg.seq, inputs, targets);
    sum += forward(M, inputs, targets);
  }
  return sum / EVAL_BATCHES;
}

int main(int argc, char** argv) {
  static const char* const valued[] = {"--steps", "--eval-every", NULL};
  static const char* const plain[] = {NULL};
  check_args(argc, argv, valued, plain);
  const int steps = count_option(argc, argv, "--steps", "C_LOOP_STEPS", 20, 0, 1000000000);
  const int eval_every = count_option(argc, argv, "--eval-every", "C_LOOP_EVAL_EVERY", 5, 0, 1000000000);
  static int text[TEXT_TOKENS];
  make_text(text, TEXT_TOKENS, cfg.vocab);
  int* inputs = malloc(sizeof(int) * (size_t)(cfg.batch * cfg.seq));
  int* targets = malloc(sizeof(int) * (size_t)(cfg.batch * cfg.seq));
  model M;
  model_init(&M);
  for (int step = 1; step <= steps; ++step) {
    get_batch(text, TRAIN_TOKENS, step * cfg.batch * cfg.seq, cfg.batch, cfg.seq, inputs, targets);
    const float loss = train_step(&M, inputs, targets, step);
    printf("step %d train loss %.9g\n", step, loss);
    if (eval_every > 0 && step % eval_every == 0) printf("step %d eval loss %.9g\n", step, eval_loss(&M, text, inputs, targets));
  }
  model_free(&M);
  free(inputs);
  free(targets);
  return 0;
}
