// Causal self-attention: forward against a float64 reference, backward by finite differences,
// the causal mask (the future never changes the past), the masked softmax alone, cuda vs cpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernel_rig.hpp"
#include "kernels/attention.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

/// out[b, t, h*hs + d] = sum_{j <= t} softmax_j(q_t . k_j / sqrt(hs)) v_j[d].
std::vector<double> attention_ref(const std::vector<double>& qkv, const attention_shape& sh) {
  const int T = sh.seq, C = sh.channels, H = sh.heads, hs = C / H;
  std::vector<double> out(static_cast<std::size_t>(sh.batch) * T * C, 0.0);
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const double* q = &qkv[(b * T + i) * 3 * C + h * hs];
        std::vector<double> w(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          const double* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double s = 0;
          for (int d = 0; d < hs; ++d) s += q[d] * k[d];
          w[j] = s / std::sqrt(double(hs));
          mx = std::max(mx, w[j]);
        }
        double sum = 0;
        for (auto& x : w) sum += (x = std::exp(x - mx));
        for (int j = 0; j <= i; ++j) {
          const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * hs];
          for (int d = 0; d < hs; ++d) out[(b * T + i) * C + h * hs + d] += w[j] / sum * v[d];
        }
      }
  return out;
}

struct attention_run {
  std::vector<float> out, probs, dqkv;
};

attention_run run_attention(rig& r, const attention_shape& sh, const std::vector<float>& qkv,
                            const std::vector<float>& dout) {
  const std::size_t n_out = static_cast<std::size_t>(sh.batch) * sh.seq * sh.channels;
  const std::size_t n_probs = static_cast<std::size_t>(sh.batch) * sh.heads * sh.seq * sh.seq;
  const float* dq = r.up(qkv);
  float* out = r.alloc<float>(n_out);
  float* probs = r.alloc<float>(n_probs);
  attention_forward(r.ctx(), r.s(), sh, dq, out, probs);
  float* dqkv = r.alloc<float>(qkv.size());
  float* scratch = r.alloc<float>(n_probs);
  attention_backward(r.ctx(), r.s(), sh, dq, probs, r.up(dout), dqkv, scratch);
  return {r.down(out, n_out), r.down(probs, n_probs), r.down(dqkv, qkv.size())};
}

}  // namespace

TEST(Attention, ForwardMatchesFloat64AndBackwardMatchesFiniteDifferences) {
  const attention_shape sh{2, 5, 8, 2};
  const auto qkv = random_floats(static_cast<std::size_t>(sh.batch) * sh.seq * 3 * sh.channels, 1);
  const auto up = random_floats(static_cast<std::size_t>(sh.batch) * sh.seq * sh.channels, 2);
  rig r;
  const auto got = run_attention(r, sh, qkv, up);
  const auto X = widen(qkv), U = widen(up);
  expect_near_all(got.out, attention_ref(X, sh), 1e-5, 1e-5, "out");
  expect_near_all(got.dqkv, numeric_gradient([&](const auto& v) { return dot(attention_ref(v, sh), U); }, X), 1e-4,
                  1e-3, "dqkv");
  // Probabilities: rows sum to one, zero above the diagonal.
  for (int row = 0; row < sh.batch * sh.heads * sh.seq; ++row) {
    const int i = row % sh.seq;
    double sum = 0;
    for (int j = 0; j < sh.seq; ++j) {
      const float p = got.probs[row * sh.seq + j];
      if (j > i) {
        EXPECT_EQ(p, 0.0f);
      }
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST(Attention, TheFutureNeverChangesThePast) {
  const attention_shape sh{1, 6, 12, 3};
  auto qkv = random_floats(static_cast<std::size_t>(sh.seq) * 3 * sh.channels, 3);
  const std::vector<float> up(static_cast<std::size_t>(sh.seq) * sh.channels, 1.0f);
  rig r;
  const auto before = run_attention(r, sh, qkv, up);
  for (int c = 0; c < 3 * sh.channels; ++c) qkv[(sh.seq - 1) * 3 * sh.channels + c] += 3.0f;  // last token
  const auto after = run_attention(r, sh, qkv, up);
  const std::size_t past = static_cast<std::size_t>(sh.seq - 1) * sh.channels;
  EXPECT_TRUE(same_bits({before.out.begin(), before.out.begin() + past}, {after.out.begin(), after.out.begin() + past}));
  EXPECT_FALSE(same_bits(before.out, after.out));
}

TEST(CausalSoftmax, BackwardMatchesFiniteDifferences) {
  const int batch = 2, seq = 4;
  const auto x = random_floats(batch * seq * seq, 4, -2.0f, 2.0f);
  const auto up = random_floats(batch * seq * seq, 5);
  auto ref = [&](const std::vector<double>& v) {
    double l = 0;
    for (int row = 0; row < batch * seq; ++row) {
      const int i = row % seq;
      double sum = 0;
      for (int j = 0; j <= i; ++j) sum += std::exp(v[row * seq + j]);
      for (int j = 0; j <= i; ++j) l += up[row * seq + j] * std::exp(v[row * seq + j]) / sum;
    }
    return l;
  };
  rig r;
  float* p = r.up(x);
  causal_softmax_forward(r.ctx(), r.s(), p, batch, seq);
  float* d = r.up(up);
  causal_softmax_backward(r.ctx(), r.s(), p, d, batch, seq, 0.5f);
  auto want = numeric_gradient(ref, widen(x));
  for (auto& w : want) w *= 0.5;
  expect_near_all(r.down(d, x.size()), want, 1e-5, 1e-4);
}

TEST(Attention, RejectsChannelsNotDivisibleByHeads) {
  rig r;
  float* d = r.alloc<float>(64);
  EXPECT_THROW(attention_forward(r.ctx(), r.s(), attention_shape{1, 2, 10, 3}, d, d, d), spillway::usage_error);
}

// One CUDA block per score row, and a grid holds at most 2^31 - 1 blocks: more rows are refused
// on the shape alone, on every backend, before any work (the null buffers are never touched).
TEST(Attention, RejectsMoreScoreRowsThanAGridHolds) {
  rig r;
  float* none = nullptr;
  // 2^31 rows: one past the limit; 2^32 rows: would wrap to 0 blocks in an unsigned grid size.
  EXPECT_THROW(causal_softmax_forward(r.ctx(), r.s(), none, 1 << 16, 1 << 15), spillway::usage_error);
  EXPECT_THROW(causal_softmax_forward(r.ctx(), r.s(), none, 1 << 16, 1 << 16), spillway::usage_error);
  EXPECT_THROW(causal_softmax_backward(r.ctx(), r.s(), none, none, 1 << 16, 1 << 16, 1.0f), spillway::usage_error);
  bf16* none16 = nullptr;
  EXPECT_THROW(causal_softmax_forward(r.ctx(), r.s(), none16, 3, 1 << 30), spillway::usage_error);
  // batch * heads * seq = 2 * 2^15 * 2^15 rows: refused before the first GEMM.
  const attention_shape wide{2, 1 << 15, 1 << 15, 1 << 15};
  EXPECT_THROW(attention_forward(r.ctx(), r.s(), wide, none, none, none), spillway::usage_error);
  EXPECT_THROW(attention_backward(r.ctx(), r.s(), wide, none, none, none, none, none), spillway::usage_error);
  EXPECT_THROW((void)attention_bf16_workspace_bytes(r.ctx(), wide), spillway::usage_error);
  try {
    causal_softmax_forward(r.ctx(), r.s(), none, 1 << 16, 1 << 16);
  } catch (const spillway::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("65536 * 65536 score rows"), std::string::npos) << e.what();
  }
  r.sync();  // nothing was enqueued, and the stream is not failed
}

TEST(AttentionCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const attention_shape sh{2, 64, 96, 4};
  const auto qkv = random_floats(static_cast<std::size_t>(sh.batch) * sh.seq * 3 * sh.channels, 6);
  const auto up = random_floats(static_cast<std::size_t>(sh.batch) * sh.seq * sh.channels, 7);
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_attention(cpu, sh, qkv, up);
  const auto got = run_attention(gpu, sh, qkv, up);
  expect_near_all(got.out, want.out, 1e-5, 1e-4, "out");
  expect_near_all(got.probs, want.probs, 1e-6, 1e-4, "probs");
  expect_near_all(got.dqkv, want.dqkv, 1e-5, 1e-3, "dqkv");
}
