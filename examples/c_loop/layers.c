/* The layers of the small GPT (layers.h): plain loops over float arrays, written for this example. */
#include "layers.h"

#include <math.h>

#include <stdio.h>

static const char* const layer_param_names[P_PER_LAYER] = {
    "ln1.w", "ln1.b", "qkv.w", "qkv.b", "proj.w", "proj.b", "ln2.w", "ln2.b", "fc.w", "fc.b", "fcproj.w", "fcproj.b"};

static void add_tensor(gpt_layout* lay, const char* name, size_t count) {
  const int i = lay->tensors++;
  lay->offset[i] = lay->total;
  lay->count[i] = count;
  snprintf(lay->name[i], sizeof lay->name[i], "%s", name);
  lay->total += count;
}

void gpt_layout_init(gpt_layout* lay, const gpt_config* cfg) {
  const size_t V = (size_t)cfg->vocab, C = (size_t)cfg->channels, T = (size_t)cfg->seq;
  const size_t n[P_PER_LAYER] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
  lay->tensors = 0;
  lay->total = 0;
  add_tensor(lay, "wte", V * C);
  add_tensor(lay, "wpe", T * C);
  for (int l = 0; l < cfg->layers; ++l)
    for (int k = 0; k < P_PER_LAYER; ++k) {
      char name[32];
      snprintf(name, sizeof name, "h%d.%s", l, layer_param_names[k]);
      add_tensor(lay, name, n[k]);
    }
  add_tensor(lay, "lnf.w", C);
  add_tensor(lay, "lnf.b", C);
}

uint32_t lcg_next(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(*state >> 33);
}

float lcg_uniform(uint64_t* state) { return (float)lcg_next(state) / 2147483648.0f * 2.0f - 1.0f; }

void make_text(int* text, int n, int vocab) {
  uint64_t state = 12345;
  int prev = 0;
  for (int i = 0; i < n; ++i) {
    /* mostly a fixed successor of the previous token, sometimes a jump */
    const uint32_t r = lcg_next(&state);
    prev = (r % 8 == 0) ? (int)(r / 8 % (uint32_t)vocab) : (prev * 5 + 3) % vocab;
    text[i] = prev;
  }
}

void get_batch(const int* text, int text_n, int position, int batch, int seq, int* inputs, int* targets) {
  for (int b = 0; b < batch; ++b) {
    const int start = (position + b * 37) % (text_n - seq - 1);
    for (int t = 0; t < seq; ++t) {
      inputs[b * seq + t] = text[start + t];
      targets[b * seq + t] = text[start + t + 1];
    }
  }
}

void gpt_init_params(float* params, const gpt_layout* lay, const gpt_config* cfg, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = 0; i < lay->total; ++i) params[i] = 0.02f * lcg_uniform(&state);
  for (int t = 2; t < lay->tensors; ++t) {
    const int k = t < LNFW(cfg) ? (t - 2) % P_PER_LAYER : t == LNFW(cfg) ? P_LN1W : P_LN1B;
    const int is_norm_weight = k == P_LN1W || k == P_LN2W;
    const int is_bias = k == P_LN1B || k == P_LN2B || k == P_QKVB || k == P_PROJB || k == P_FCB || k == P_FCPROJB;
    for (size_t i = 0; i < lay->count[t]; ++i)
      if (is_norm_weight || is_bias) params[lay->offset[t] + i] = is_norm_weight ? 1.0f : 0.0f;
  }
}

/* ---- forward ---------------------------------------------------------------------------------- */

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* e = wte + (size_t)tokens[b * T + t] * C;
      const float* p = wpe + (size_t)t * C;
      float* o = out + ((size_t)b * T + t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + (size_t)n * C;
    float m = 0.0f;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= (float)C;
    float var = 0.0f;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= (float)C;
    const float s = 1.0f / sqrtf(var + 1e-5f);
    float* o = out + (size_t)n * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + (size_t)n * C;
    for (int o = 0; o < OC; ++o) {
      const float* row = w + (size_t)o * C;
      float sum = bias != NULL ? bias[o] : 0.0f;
      for (int c = 0; c < C; ++c) sum += x[c] * row[c];
      out[(size_t)n * OC + o] = sum;
    }
  }
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
        float* a = att + (((size_t)b * NH + h) * T + t) * T;
        float max = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          const float* k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
          float s = 0.0f;
          for (int i = 0; i < hs; ++i) s += q[i] * k[i];
          a[u] = s * scale;
          if (a[u] > max) max = a[u];
        }
        float sum = 0.0f;
        for (int u = 0; u <= t; ++u) sum += a[u] = expf(a[u] - max);
        for (int u = 0; u <= t; ++u) a[u] /= sum;
        for (int u = t + 1; u < T; ++u) a[u] = 0.0f; /* the causal mask */
        float* o = out + ((size_t)b * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int u = 0; u <= t; ++u) {
          const float* v = qkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
          for (int i = 0; i < hs; ++i) o[i] += a[u] * v[i];
        }
      }
}

void residual_forward(float* out, const float* a, const float* b, int N) {
  for (int i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

/* GELU, tanh approximation. */
static const float gelu_k = 0.7978845608f; /* sqrt(2 / pi) */

void gelu_forward(float* out, const float* inp, int N) {
  for (int i = 0; i < N; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(gelu_k * (x + 0.044715f * x * x * x)));
  }
}

void crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const float* z = logits + (size_t)n * V;
    float* p = probs + (size_t)n * V;
    float max = z[0];
    for (int v = 1; v < V; ++v)
      if (z[v] > max) max = z[v];
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) sum += p[v] = expf(z[v] - max);
    for (int v = 0; v < V; ++v) p[v] /= sum;
    losses[n] = -logf(p[targets[n]]);
  }
}

float mean_loss(const float* losses, int N) {
  double sum = 0.0;
  for (int n = 0; n < N; ++n) sum += losses[n];
  return (float)(sum / N);
}

/* ---- backward --------------------------------------------------------------------------------- */

void crossentropy_backward(float* dlogits, const float* probs, const int* targets, int N, int V) {
  const float inv_n = 1.0f / (float)N; /* the loss is the mean over positions */
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      const float p = probs[(size_t)n * V + v];
      dlogits[(size_t)n * V + v] += (p - (v == targets[n] ? 1.0f : 0.0f)) * inv_n;
    }
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int N, int C, int OC) {
  for (int n = 0; n < N; ++n) {
    const float* d = dout + (size_t)n * OC;
    float* di = dinp + (size_t)n * C;
    for (int o = 0; o < OC; ++o) {
      const float* row = w + (size_t)o * C;
      for (int c = 0; c < C; ++c) di[c] += d[o] * row[c];
    }
  }
  for (int o = 0; o < OC; ++o) {
    float* dr = dw + (size_t)o * C;
    for (int n = 0; n < N; ++n) {
      const float d = dout[(size_t)n * OC + o];
      const float* x = inp + (size_t)n * C;
      for (int c = 0; c < C; ++c) dr[c] += d * x[c];
      if (dbias != NULL) dbias[o] += d;
    }
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* d = dout + (size_t)n * C;
    const float* x = inp + (size_t)n * C;
    float* di = dinp + (size_t)n * C;
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - mean[n]) * rstd[n];
      const float dnorm = w[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= (float)C;
    dnorm_norm_mean /= (float)C;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - mean[n]) * rstd[n];
      const float dnorm = w[c] * d[c];
      db[c] += d[c];
      dw[c] += norm * d[c];
      di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
    }
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int N) {
  for (int i = 0; i < N; ++i) {
    const float x = inp[i];
    const float u = gelu_k * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * gelu_k * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += grad * dout[i];
  }
}

void residual_backward(float* dinp, const float* dout, int N) {
  for (int i = 0; i < N; ++i) dinp[i] += dout[i];
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf((float)hs);
  float datt[1024]; /* one row of T (T <= 1024) */
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* a = att + (((size_t)b * NH + h) * T + t) * T;
        const float* d = dout + ((size_t)b * T + t) * C + h * hs;
        /* out = sum_u a[u] v[u]: gradients of a and of v */
        float dot = 0.0f;
        for (int u = 0; u <= t; ++u) {
          const float* v = qkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
          float* dv = dqkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
          float s = 0.0f;
          for (int i = 0; i < hs; ++i) {
            s += d[i] * v[i];
            dv[i] += a[u] * d[i];
          }
          datt[u] = s;
          dot += s * a[u];
        }
        /* through the softmax, then the scaled dot products */
        const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
        float* dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
        for (int u = 0; u <= t; ++u) {
          const float dpre = a[u] * (datt[u] - dot) * scale;
          const float* k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
          float* dk = dqkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
          for (int i = 0; i < hs; ++i) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* d = dout + ((size_t)b * T + t) * C;
      float* de = dwte + (size_t)tokens[b * T + t] * C;
      float* dp = dwpe + (size_t)t * C;
      for (int c = 0; c < C; ++c) {
        de[c] += d[c];
        dp[c] += d[c];
      }
    }
}

/* ---- optimizer -------------------------------------------------------------------------------- */

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t) {
  const float c1 = 1.0f - powf(beta1, (float)t), c2 = 1.0f - powf(beta2, (float)t);
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    const float mhat = m[i] / c1, vhat = v[i] / c2;
    params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
  }
}
