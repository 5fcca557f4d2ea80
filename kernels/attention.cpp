// Causal self-attention as GEMMs over heads (strided batches that read q, k, v in place inside
// the fused qkv rows) around a masked softmax; plus the cpu launchers of that softmax.
#include "kernels/attention.hpp"

#include <climits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda_launchers.hpp"
#include "kernels/gemm.hpp"
#include "kernels/host_exp.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {

namespace {

// The causal softmax runs one row of scores per CUDA block, and a grid holds at most 2^31 - 1
// blocks; a larger count would be refused at launch or, taken modulo 2^32, silently cover only
// part of the rows. Both backends refuse it alike, on the shape alone, before any work.
void check_score_rows(long long batch, int seq, const char* kernel, const char* batch_words) {
  SPILLWAY_EXPECTS_T(usage_error, batch <= INT_MAX / seq,  // seq > 0, checked before
                     std::string(kernel) + ": " + batch_words + " * seq = " + std::to_string(batch) + " * " +
                         std::to_string(seq) +
                         " score rows, above the 2147483647 (2^31 - 1) supported: split the batch");
}

// The causal softmax, one body for float32 and bf16 storage. A row's exponentials are taken at
// once (Note [Host exponentials]); a float32 row keeps them in the scores between the sum and
// the scaling, a bf16 row in a float32 row of its own, so it is rounded once, at its final
// value. Both give the bits of exp(x - max) * (1 / sum) in float, summed in order.
template <class T>
void causal_forward(kernel_context& ctx, stream s, T* scores, int batch, int seq) {
  SPILLWAY_KERNEL_EXPECTS(batch >= 0 && seq > 0, "causal_softmax_forward");
  check_score_rows(batch, seq, "causal_softmax_forward", "batch");
  if (batch == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_causal_softmax_forward(ctx, s, scores, batch, seq), [=] {
    const auto t = static_cast<std::size_t>(seq);
    detail::parallel_for(static_cast<std::size_t>(batch) * t, detail::grain_for(t), [&](std::size_t b, std::size_t e) {
      std::vector<float> wide(std::is_same_v<T, float> ? 0 : t);
      for (std::size_t row = b; row < e; ++row) {
        const std::size_t i = row % t;  // query position: columns 0..i are visible
        T* x = scores + row * t;
        float mx = load(x[0]);
        for (std::size_t j = 1; j <= i; ++j) mx = load(x[j]) > mx ? load(x[j]) : mx;
        float* ex = nullptr;
        if constexpr (std::is_same_v<T, float>)
          ex = x;
        else
          ex = wide.data();
        for (std::size_t j = 0; j <= i; ++j) ex[j] = load(x[j]) - mx;
        detail::exp_in_place(ex, i + 1);
        float sum = 0.0f;
        for (std::size_t j = 0; j <= i; ++j) sum += ex[j];
        const float inv = 1.0f / sum;
        for (std::size_t j = 0; j <= i; ++j) x[j] = store_as<T>(ex[j] * inv);
        for (std::size_t j = i + 1; j < t; ++j) x[j] = store_as<T>(0.0f);
      }
    });
  });
}

template <class T>
void causal_backward(kernel_context& ctx, stream s, const T* probs, T* dprobs, int batch, int seq, float scale) {
  SPILLWAY_KERNEL_EXPECTS(batch >= 0 && seq > 0, "causal_softmax_backward");
  check_score_rows(batch, seq, "causal_softmax_backward", "batch");
  if (batch == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_causal_softmax_backward(ctx, s, probs, dprobs, batch, seq, scale),
                         [=] {
    const auto t = static_cast<std::size_t>(seq);
    detail::parallel_for(static_cast<std::size_t>(batch) * t, detail::grain_for(t), [&](std::size_t b, std::size_t e) {
      for (std::size_t row = b; row < e; ++row) {
        const std::size_t i = row % t;
        const T* p = probs + row * t;
        T* d = dprobs + row * t;
        float dot = 0.0f;
        for (std::size_t j = 0; j <= i; ++j) dot += load(p[j]) * load(d[j]);
        for (std::size_t j = 0; j <= i; ++j) d[j] = store_as<T>(scale * ops::softmax_grad(load(p[j]), load(d[j]), dot));
        for (std::size_t j = i + 1; j < t; ++j) d[j] = store_as<T>(0.0f);
      }
    });
  });
}

}  // namespace

void causal_softmax_forward(kernel_context& ctx, stream s, float* scores, int batch, int seq) {
  causal_forward(ctx, s, scores, batch, seq);
}

void causal_softmax_forward(kernel_context& ctx, stream s, bf16* scores, int batch, int seq) {
  causal_forward(ctx, s, scores, batch, seq);
}

void causal_softmax_backward(kernel_context& ctx, stream s, const float* probs, float* dprobs,
                             int batch, int seq, float scale) {
  causal_backward(ctx, s, probs, dprobs, batch, seq, scale);
}

void causal_softmax_backward(kernel_context& ctx, stream s, const bf16* probs, bf16* dprobs, int batch, int seq,
                             float scale) {
  causal_backward(ctx, s, probs, dprobs, batch, seq, scale);
}

namespace {

struct attention_dims {
  int t, c, h, hs;
  long long qkv_ld, batch_qkv, batch_out, batch_probs, tt;
};

attention_dims dims_of(const attention_shape& sh) {
  SPILLWAY_KERNEL_EXPECTS(sh.batch >= 0 && sh.seq > 0 && sh.heads > 0 && sh.channels > 0 &&
                              sh.channels % sh.heads == 0,
                          "attention: channels must be a positive multiple of heads");
  // The softmax sees batch * heads matrices of seq rows: refuse here, before the first GEMM.
  check_score_rows(static_cast<long long>(sh.batch) * sh.heads, sh.seq, "attention", "batch * heads");
  attention_dims d{};
  d.t = sh.seq;
  d.c = sh.channels;
  d.h = sh.heads;
  d.hs = sh.channels / sh.heads;
  d.qkv_ld = 3LL * d.c;
  d.batch_qkv = static_cast<long long>(d.t) * d.qkv_ld;
  d.batch_out = static_cast<long long>(d.t) * d.c;
  d.tt = static_cast<long long>(d.t) * d.t;
  d.batch_probs = d.h * d.tt;
  return d;
}

// The compositions, one body for float32 and bf16 storage: each GEMM and the softmax are the
// storage type's overloads, so a bf16 attention rounds once per stage (scores, probabilities,
// output; in backward dprobs, dscores, dq, dk, dv).
template <class T>
void forward(kernel_context& ctx, stream s, const attention_shape& shape, const T* qkv, T* out, T* probs) {
  const attention_dims d = dims_of(shape);
  const int ld = static_cast<int>(d.qkv_ld);
  const float scale = 1.0f / sqrtf(static_cast<float>(d.hs));
  for (int b = 0; b < shape.batch; ++b) {
    const T* q = qkv + b * d.batch_qkv;
    // scores[h] = scale * q_h k_h^T, one [t, t] matrix per head.
    gemm_strided_batched(ctx, s, transpose::no, transpose::yes, d.t, d.t, d.hs, scale, q, ld, d.hs,
                         q + d.c, ld, d.hs, 0.0f, probs + b * d.batch_probs, d.t, d.tt, d.h);
  }
  causal_softmax_forward(ctx, s, probs, shape.batch * d.h, d.t);
  for (int b = 0; b < shape.batch; ++b) {
    const T* v = qkv + b * d.batch_qkv + 2 * d.c;
    // out_h = probs_h v_h, written into the head's columns of out.
    gemm_strided_batched(ctx, s, transpose::no, transpose::no, d.t, d.hs, d.t, 1.0f,
                         probs + b * d.batch_probs, d.t, d.tt, v, ld, d.hs, 0.0f,
                         out + b * d.batch_out, d.c, d.hs, d.h);
  }
}

template <class T>
void backward(kernel_context& ctx, stream s, const attention_shape& shape, const T* qkv, const T* probs,
              const T* dout, T* dqkv, T* scratch) {
  const attention_dims d = dims_of(shape);
  const int ld = static_cast<int>(d.qkv_ld);
  const float scale = 1.0f / sqrtf(static_cast<float>(d.hs));
  for (int b = 0; b < shape.batch; ++b) {
    const T* q = qkv + b * d.batch_qkv;
    const T* dy = dout + b * d.batch_out;
    const T* p = probs + b * d.batch_probs;
    T* dq = dqkv + b * d.batch_qkv;
    // dprobs_h = dy_h v_h^T
    gemm_strided_batched(ctx, s, transpose::no, transpose::yes, d.t, d.t, d.hs, 1.0f, dy, d.c, d.hs,
                         q + 2 * d.c, ld, d.hs, 0.0f, scratch + b * d.batch_probs, d.t, d.tt, d.h);
    // dv_h = probs_h^T dy_h
    gemm_strided_batched(ctx, s, transpose::yes, transpose::no, d.t, d.hs, d.t, 1.0f, p, d.t, d.tt,
                         dy, d.c, d.hs, 0.0f, dq + 2 * d.c, ld, d.hs, d.h);
  }
  // dscores (with the 1/sqrt(hs) of the forward folded in), in place of dprobs.
  causal_softmax_backward(ctx, s, probs, scratch, shape.batch * d.h, d.t, scale);
  for (int b = 0; b < shape.batch; ++b) {
    const T* q = qkv + b * d.batch_qkv;
    const T* ds = scratch + b * d.batch_probs;
    T* dq = dqkv + b * d.batch_qkv;
    // dq_h = dscores_h k_h ; dk_h = dscores_h^T q_h
    gemm_strided_batched(ctx, s, transpose::no, transpose::no, d.t, d.hs, d.t, 1.0f, ds, d.t, d.tt,
                         q + d.c, ld, d.hs, 0.0f, dq, ld, d.hs, d.h);
    gemm_strided_batched(ctx, s, transpose::yes, transpose::no, d.t, d.hs, d.t, 1.0f, ds, d.t, d.tt,
                         q, ld, d.hs, 0.0f, dq + d.c, ld, d.hs, d.h);
  }
}

}  // namespace

void attention_forward(kernel_context& ctx, stream s, const attention_shape& shape, const float* qkv,
                       float* out, float* probs) {
  forward(ctx, s, shape, qkv, out, probs);
}

void attention_forward(kernel_context& ctx, stream s, const attention_shape& shape, const bf16* qkv, bf16* out,
                       bf16* probs) {
  forward(ctx, s, shape, qkv, out, probs);
}

void attention_backward(kernel_context& ctx, stream s, const attention_shape& shape, const float* qkv,
                        const float* probs, const float* dout, float* dqkv, float* scratch) {
  backward(ctx, s, shape, qkv, probs, dout, dqkv, scratch);
}

void attention_backward(kernel_context& ctx, stream s, const attention_shape& shape, const bf16* qkv,
                        const bf16* probs, const bf16* dout, bf16* dqkv, bf16* scratch) {
  backward(ctx, s, shape, qkv, probs, dout, dqkv, scratch);
}

std::size_t attention_bf16_workspace_bytes(const kernel_context& ctx, const attention_shape& shape) {
  const attention_dims d = dims_of(shape);
  // Every GEMM of both passes multiplies a [t, t] and a [t, hs] matrix, or a [t, hs] and an
  // [hs, t] one: two shapes (m, n, k).
  const std::size_t a = gemm_bf16_workspace_bytes(ctx, d.t, d.t, d.hs);
  const std::size_t b = gemm_bf16_workspace_bytes(ctx, d.t, d.hs, d.t);
  return a > b ? a : b;
}

}  // namespace spillway::kernels
