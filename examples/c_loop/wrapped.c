/* c_loop_wrapped: plain.c with Spillway around its calls (C API, capi/spillway.h): the flat
 * buffers are persistent tensors with a view per parameter tensor, activations are transients
 * released after their last use, each layer call is an op naming the views it touches and runs
 * the unchanged layer function of layers.c on host pointers (calls.c), gradients accumulate. The
 * forward calls are recomputable ops (plans may run them again instead of keeping what they
 * wrote) and the AdamW steps host-capable ops (plans may run them on the host).
 * Usage: c_loop_wrapped [--steps N] [--eval-every N] [--least-budget] [--config FILE]
 * (or C_LOOP_STEPS, C_LOOP_EVAL_EVERY); Session settings from SPILLWAY_* (or FILE). A summary line
 * goes to stderr at the end; C_LOOP_REPORTS=1 adds a line per iteration. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calls.h"
#include "args.h"
#include "layers.h"

static const gpt_config cfg = {.vocab = 64, .layers = 2, .channels = 32, .heads = 2, .seq = 16, .batch = 4};
static const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
enum { TEXT_TOKENS = 4096, TRAIN_TOKENS = 3072, EVAL_BATCHES = 2 };

/* The activations of one block; `out` is the next block's input. */
typedef struct layer_acts {
  spw_tensor ln1, mean1, rstd1, qkv, att, atty, proj, x2, ln2, mean2, rstd2, fc, gelu, fcproj, out;
} layer_acts;
/* The activations of the model (and, in a second copy, their gradients). */
typedef struct acts {
  spw_tensor enc;
  layer_acts l[MAX_LAYERS];
  spw_tensor lnf, meanf, rstdf, logits, probs, losses;
} acts;

typedef struct model {
  gpt_layout lay;
  spw_session* s;
  spw_tensor params, grads, m, v;                                       /* flat buffers of lay.total floats */
  spw_tensor p[MAX_TENSORS], g[MAX_TENSORS], pm[MAX_TENSORS], pv[MAX_TENSORS]; /* a view per tensor */
  acts a, d;
} model;

#define OP(name, fn, args, ...) op_call(S, name, fn, args, __VA_ARGS__)
#define FWD(name, fn, args, ...) recomputable_call(S, name, fn, args, __VA_ARGS__) /* plans may rerun it */

/* The activations of block l, as transients of this iteration. */
static void add_layer_acts(spw_session* S, layer_acts* y, int l) {
  const size_t B = (size_t)cfg.batch, T = (size_t)cfg.seq, C = (size_t)cfg.channels, BT = B * T;
  const size_t NH = (size_t)cfg.heads;
  const spw_kind k = SPW_ACTIVATION;
  y->ln1 = transient(S, "ln1", l, BT * C, k), y->mean1 = transient(S, "mean1", l, BT, k);
  y->rstd1 = transient(S, "rstd1", l, BT, k), y->qkv = transient(S, "qkv", l, BT * 3 * C, k);
  y->att = transient(S, "att", l, B * NH * T * T, k), y->atty = transient(S, "atty", l, BT * C, k);
  y->proj = transient(S, "proj", l, BT * C, k), y->x2 = transient(S, "x2", l, BT * C, k);
  y->ln2 = transient(S, "ln2", l, BT * C, k), y->mean2 = transient(S, "mean2", l, BT, k);
  y->rstd2 = transient(S, "rstd2", l, BT, k), y->fc = transient(S, "fc", l, BT * 4 * C, k);
  y->gelu = transient(S, "gelu", l, BT * 4 * C, k), y->fcproj = transient(S, "fcproj", l, BT * C, k);
  y->out = transient(S, "out", l, BT * C, k);
}

/* The gradients of block l's activations that its backward adds into. */
static void add_layer_grads(spw_session* S, layer_acts* dy, int l) {
  const size_t BT = (size_t)(cfg.batch * cfg.seq), C = (size_t)cfg.channels;
  const spw_kind k = SPW_ACTIVATION;
  dy->gelu = transient(S, "d.gelu", l, BT * 4 * C, k), dy->fc = transient(S, "d.fc", l, BT * 4 * C, k);
  dy->ln2 = transient(S, "d.ln2", l, BT * C, k), dy->x2 = transient(S, "d.x2", l, BT * C, k);
  dy->atty = transient(S, "d.atty", l, BT * C, k), dy->qkv = transient(S, "d.qkv", l, BT * 3 * C, k);
  dy->ln1 = transient(S, "d.ln1", l, BT * C, k);
}

/* After an evaluation's forward pass: every activation it kept. */
static void release_acts(spw_session* S, acts* a) {
  release(S, a->enc);
  for (int l = 0; l < cfg.layers; ++l) {
    const layer_acts* y = &a->l[l];
    const spw_tensor ts[] = {y->ln1, y->mean1, y->rstd1, y->qkv, y->att, y->atty, y->x2,
                             y->ln2, y->mean2, y->rstd2, y->fc, y->gelu, y->out};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i) release(S, ts[i]);
  }
  release(S, a->lnf), release(S, a->meanf), release(S, a->rstdf), release(S, a->probs);
}

static spw_tensor flat(spw_session* S, const char* name, const gpt_layout* lay, spw_kind kind, const float* init,
                       spw_tensor* views) {
  spw_tensor t;
  check(spw_add_persistent(S, name, lay->total * sizeof(float), kind, init, &t), name);
  for (int i = 0; i < lay->tensors; ++i) {
    char view[64];
    snprintf(view, sizeof view, "%s.%s", lay->name[i], name);
    check(spw_add_view(S, t, lay->offset[i] * sizeof(float), lay->count[i] * sizeof(float), view, &views[i]), view);
  }
  return t;
}

static void model_init(model* M, const char* config_file) {
  gpt_layout_init(&M->lay, &cfg);
  const size_t bytes = M->lay.total * sizeof(float);
  float* init = malloc(bytes);
  gpt_init_params(init, &M->lay, &cfg, 1234);
  check(config_file != NULL ? spw_session_from_json_file(config_file, &M->s) : spw_session_from_env(&M->s), "session");
  spw_session* S = M->s;
  M->params = flat(S, "params", &M->lay, SPW_PARAMETER, init, M->p);
  M->grads = flat(S, "grads", &M->lay, SPW_GRADIENT, NULL, M->g);
  M->m = flat(S, "adam.m", &M->lay, SPW_OPTIMIZER_STATE, NULL, M->pm);
  M->v = flat(S, "adam.v", &M->lay, SPW_OPTIMIZER_STATE, NULL, M->pv);
  free(init);
}

static void model_free(model* M) { spw_session_destroy(M->s); }

/* The forward pass; returns the mean loss. */
static float forward(model* M, const int* inputs, const int* targets) {
  const int B = cfg.batch, T = cfg.seq, C = cfg.channels, V = cfg.vocab, NH = cfg.heads, BT = B * T;
  spw_session* S = M->s;
  acts* a = &M->a;
  const spw_tensor* p = M->p;
  a->enc = transient(S, "enc", -1, (size_t)(BT * C), SPW_ACTIVATION);
  FWD("encoder.forward", encoder_forward_t, ARGS(W(a->enc), R(p[WTE]), R(p[WPE])), TOKENS(inputs, B, T, C));
  for (int l = 0; l < cfg.layers; ++l) {
    layer_acts* y = &a->l[l];
    add_layer_acts(S, y, l);
    const spw_tensor x = l == 0 ? a->enc : a->l[l - 1].out;
    FWD("ln1.forward", layernorm_forward_t, ARGS(W(y->ln1), W(y->mean1), W(y->rstd1), R(x), R(p[LW(l, P_LN1W)]), R(p[LW(l, P_LN1B)])), INTS(BT, C));
    FWD("qkv.forward", matmul_forward_t, ARGS(W(y->qkv), R(y->ln1), R(p[LW(l, P_QKVW)]), R(p[LW(l, P_QKVB)])), INTS(BT, C, 3 * C));
    FWD("attention.forward", attention_forward_t, ARGS(W(y->atty), W(y->att), R(y->qkv)), INTS(B, T, C, NH));
    FWD("proj.forward", matmul_forward_t, ARGS(W(y->proj), R(y->atty), R(p[LW(l, P_PROJW)]), R(p[LW(l, P_PROJB)])), INTS(BT, C, C));
    FWD("residual1.forward", residual_forward_t, ARGS(W(y->x2), R(x), R(y->proj)), INTS(BT * C));
    release(S, y->proj);
    FWD("ln2.forward", layernorm_forward_t, ARGS(W(y->ln2), W(y->mean2), W(y->rstd2), R(y->x2), R(p[LW(l, P_LN2W)]), R(p[LW(l, P_LN2B)])), INTS(BT, C));
    FWD("fc.forward", matmul_forward_t, ARGS(W(y->fc), R(y->ln2), R(p[LW(l, P_FCW)]), R(p[LW(l, P_FCB)])), INTS(BT, C, 4 * C));
    FWD("gelu.forward", gelu_forward_t, ARGS(W(y->gelu), R(y->fc)), INTS(BT * 4 * C));
    FWD("fcproj.forward", matmul_forward_t, ARGS(W(y->fcproj), R(y->gelu), R(p[LW(l, P_FCPROJW)]), R(p[LW(l, P_FCPROJB)])), INTS(BT, 4 * C, C));
    FWD("residual2.forward", residual_forward_t, ARGS(W(y->out), R(y->x2), R(y->fcproj)), INTS(BT * C));
    release(S, y->fcproj);
  }
  const spw_tensor last = a->l[cfg.layers - 1].out;
  a->lnf = transient(S, "lnf", -1, (size_t)(BT * C), SPW_ACTIVATION), a->meanf = transient(S, "meanf", -1, (size_t)BT, SPW_ACTIVATION);
  a->rstdf = transient(S, "rstdf", -1, (size_t)BT, SPW_ACTIVATION), a->logits = transient(S, "logits", -1, (size_t)(BT * V), SPW_ACTIVATION);
  a->probs = transient(S, "probs", -1, (size_t)(BT * V), SPW_ACTIVATION), a->losses = transient(S, "losses", -1, (size_t)BT, SPW_METRIC);
  FWD("lnf.forward", layernorm_forward_t, ARGS(W(a->lnf), W(a->meanf), W(a->rstdf), R(last), R(p[LNFW(&cfg)]), R(p[LNFB(&cfg)])), INTS(BT, C));
  FWD("logits.forward", matmul_forward_nobias_t, ARGS(W(a->logits), R(a->lnf), R(p[WTE])), INTS(BT, C, V));
  FWD("loss.forward", crossentropy_forward_t, ARGS(W(a->losses), W(a->probs), R(a->logits)), TOKENS(targets, BT, V));
  release(S, a->logits);
  float losses[1024];
  check(spw_read(S, a->losses, losses, sizeof(float) * (size_t)BT), "read losses");
  release(S, a->losses);
  return mean_loss(losses, BT);
}

/* The backward pass: adds into the gradients and the activations' gradients. */
static void backward(model* M, const int* inputs, const int* targets) {
  const int B = cfg.batch, T = cfg.seq, C = cfg.channels, V = cfg.vocab, NH = cfg.heads, BT = B * T;
  const int L = cfg.layers;
  spw_session* S = M->s;
  acts *a = &M->a, *d = &M->d;
  const spw_tensor *p = M->p, *g = M->g;
  d->logits = transient(S, "d.logits", -1, (size_t)(BT * V), SPW_ACTIVATION), d->lnf = transient(S, "d.lnf", -1, (size_t)(BT * C), SPW_ACTIVATION);
  OP("loss.backward", crossentropy_backward_t, ARGS(A(d->logits), R(a->probs)), TOKENS(targets, BT, V));
  OP("logits.backward", matmul_backward_nobias_t, ARGS(A(d->lnf), A(g[WTE]), R(d->logits), R(a->lnf), R(p[WTE])), INTS(BT, C, V));
  release(S, d->logits), release(S, a->probs), release(S, a->lnf);
  d->l[L - 1].out = transient(S, "d.out", L - 1, (size_t)(BT * C), SPW_ACTIVATION);
  OP("lnf.backward", layernorm_backward_t, ARGS(A(d->l[L - 1].out), A(g[LNFW(&cfg)]), A(g[LNFB(&cfg)]), R(d->lnf), R(a->l[L - 1].out), R(p[LNFW(&cfg)]), R(a->meanf), R(a->rstdf)), INTS(BT, C));
  release(S, d->lnf), release(S, a->meanf), release(S, a->rstdf), release(S, a->l[L - 1].out);
  for (int l = L - 1; l >= 0; --l) {
    const layer_acts* y = &a->l[l];
    layer_acts* dy = &d->l[l];
    add_layer_grads(S, dy, l);
    const spw_tensor x = l == 0 ? a->enc : a->l[l - 1].out;
    const spw_tensor dx = l == 0 ? (d->enc = transient(S, "d.enc", -1, (size_t)(BT * C), SPW_ACTIVATION)) : (d->l[l - 1].out = transient(S, "d.out", l - 1, (size_t)(BT * C), SPW_ACTIVATION));
    OP("fcproj.backward", matmul_backward_t, ARGS(A(dy->gelu), A(g[LW(l, P_FCPROJW)]), A(g[LW(l, P_FCPROJB)]), R(dy->out), R(y->gelu), R(p[LW(l, P_FCPROJW)])), INTS(BT, 4 * C, C));
    release(S, y->gelu);
    OP("gelu.backward", gelu_backward_t, ARGS(A(dy->fc), R(y->fc), R(dy->gelu)), INTS(BT * 4 * C));
    release(S, y->fc), release(S, dy->gelu);
    OP("fc.backward", matmul_backward_t, ARGS(A(dy->ln2), A(g[LW(l, P_FCW)]), A(g[LW(l, P_FCB)]), R(dy->fc), R(y->ln2), R(p[LW(l, P_FCW)])), INTS(BT, C, 4 * C));
    release(S, dy->fc), release(S, y->ln2);
    OP("ln2.backward", layernorm_backward_t, ARGS(A(dy->x2), A(g[LW(l, P_LN2W)]), A(g[LW(l, P_LN2B)]), R(dy->ln2), R(y->x2), R(p[LW(l, P_LN2W)]), R(y->mean2), R(y->rstd2)), INTS(BT, C));
    release(S, dy->ln2), release(S, y->x2), release(S, y->mean2), release(S, y->rstd2);
    OP("residual2.backward", residual_backward_t, ARGS(A(dy->x2), R(dy->out)), INTS(BT * C));
    release(S, dy->out);
    OP("proj.backward", matmul_backward_t, ARGS(A(dy->atty), A(g[LW(l, P_PROJW)]), A(g[LW(l, P_PROJB)]), R(dy->x2), R(y->atty), R(p[LW(l, P_PROJW)])), INTS(BT, C, C));
    release(S, y->atty);
    OP("attention.backward", attention_backward_t, ARGS(A(dy->qkv), R(dy->atty), R(y->qkv), R(y->att)), INTS(B, T, C, NH));
    release(S, dy->atty), release(S, y->qkv), release(S, y->att);
    OP("qkv.backward", matmul_backward_t, ARGS(A(dy->ln1), A(g[LW(l, P_QKVW)]), A(g[LW(l, P_QKVB)]), R(dy->qkv), R(y->ln1), R(p[LW(l, P_QKVW)])), INTS(BT, C, 3 * C));
    release(S, dy->qkv), release(S, y->ln1);
    OP("ln1.backward", layernorm_backward_t, ARGS(A(dx), A(g[LW(l, P_LN1W)]), A(g[LW(l, P_LN1B)]), R(dy->ln1), R(x), R(p[LW(l, P_LN1W)]), R(y->mean1), R(y->rstd1)), INTS(BT, C));
    release(S, dy->ln1), release(S, x), release(S, y->mean1), release(S, y->rstd1);
    OP("residual1.backward", residual_backward_t, ARGS(A(dx), R(dy->x2)), INTS(BT * C));
    release(S, dy->x2);
  }
  OP("encoder.backward", encoder_backward_t, ARGS(A(g[WTE]), A(g[WPE]), R(d->enc)), TOKENS(inputs, B, T, C));
  release(S, d->enc);
}

static float train_step(model* M, const int* inputs, const int* targets, int step) {
  spw_session* S = M->s;
  check(spw_begin_iteration(S, "train"), "begin_iteration");
  const float loss = forward(M, inputs, targets);
  backward(M, inputs, targets);
  for (int t = 0; t < M->lay.tensors; ++t) /* AdamW per view: elementwise, so the same bits */
    host_capable_call(S, "adamw.step", adamw_update_t, ARGS(RW(M->p[t]), R(M->g[t]), RW(M->pm[t]), RW(M->pv[t])), &(const call_args){.i = {(int)M->lay.count[t], step}, .f = {lr, beta1, beta2, eps, weight_decay}});
  end_iteration(S);
  return loss;
}

static float eval_loss(model* M, const int* text, int* inputs, int* targets) {
  float sum = 0.0f;
  for (int i = 0; i < EVAL_BATCHES; ++i) {
    get_batch(text + TRAIN_TOKENS, TEXT_TOKENS - TRAIN_TOKENS, i * cfg.batch * cfg.seq, cfg.batch, cfg.seq, inputs, targets);
    check(spw_begin_iteration(M->s, "eval"), "begin_iteration");
    sum += forward(M, inputs, targets);
    release_acts(M->s, &M->a);
    end_iteration(M->s);
  }
  return sum / EVAL_BATCHES;
}

static const char* text_option(int argc, char** argv, const char* flag) {
  for (int i = 1; i + 1 < argc; ++i)
    if (strcmp(argv[i], flag) == 0) return argv[i + 1];
  return NULL;
}

static int has_flag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (strcmp(argv[i], flag) == 0) return 1;
  return 0;
}

int main(int argc, char** argv) {
  static const char* const valued[] = {"--steps", "--eval-every", "--config", NULL};
  static const char* const plain[] = {"--least-budget", NULL};
  check_args(argc, argv, valued, plain);
  const int steps = count_option(argc, argv, "--steps", "C_LOOP_STEPS", 20, 0, 1000000000);
  const int eval_every = count_option(argc, argv, "--eval-every", "C_LOOP_EVAL_EVERY", 5, 0, 1000000000);
  static int text[TEXT_TOKENS];
  make_text(text, TEXT_TOKENS, cfg.vocab);
  int* inputs = malloc(sizeof(int) * (size_t)(cfg.batch * cfg.seq));
  int* targets = malloc(sizeof(int) * (size_t)(cfg.batch * cfg.seq));
  model M;
  model_init(&M, text_option(argc, argv, "--config"));
  for (int step = 1; step <= steps; ++step) {
    get_batch(text, TRAIN_TOKENS, step * cfg.batch * cfg.seq, cfg.batch, cfg.seq, inputs, targets);
    const float loss = train_step(&M, inputs, targets, step);
    printf("step %d train loss %.9g\n", step, loss);
    if (step == 1 && has_flag(argc, argv, "--least-budget")) { /* the least budget any plan needs */
      uint64_t least = 0;
      check(spw_least_budget_bytes(M.s, &least), "least_budget_bytes");
      check(spw_set_device_budget(M.s, least), "set_device_budget");
    }
    if (eval_every > 0 && step % eval_every == 0) printf("step %d eval loss %.9g\n", step, eval_loss(&M, text, inputs, targets));
  }
  summarize(M.s, stderr);
  model_free(&M);
  free(inputs);
  free(targets);
  return 0;
}
