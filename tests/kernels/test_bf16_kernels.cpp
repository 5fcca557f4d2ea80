// bf16 variants of layer norm, softmax with cross-entropy, embedding, causal softmax and
// pooling: each against its float32 kernel on the widened inputs (the same arithmetic, so every
// output is to_bf16 of the float32 result, bit for bit), repeated runs giving the same bits, and
// cuda against cpu where a GPU is present.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bf16_rig.hpp"
#include "kernels/layer_norm.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

// ---- layer norm ----

struct ln_case {
  int rows, cols;
  std::vector<bf16> x, g, b, dy, dg0, db0;  // dg0, db0: what dgamma, dbeta hold before an accumulating backward

  ln_case(int r, int c) : rows(r), cols(c) {
    x = random_bf16(static_cast<std::size_t>(r) * c, 11, -2.0f, 2.0f);
    g = random_bf16(c, 12, 0.5f, 1.5f);
    b = random_bf16(c, 13);
    dy = random_bf16(static_cast<std::size_t>(r) * c, 14);
    dg0 = random_bf16(c, 15);
    db0 = random_bf16(c, 16);
  }
};

/// Outputs of a layer norm forward and two backwards (overwrite, then accumulate onto dg0/db0),
/// in storage type T; `offset` shifts every buffer to vary addresses between runs.
template <class T>
struct ln_out {
  std::vector<T> y, dx, dg, db, dg_acc, db_acc;
  std::vector<float> mean, rstd;
};

template <class T>
std::vector<T> as(const std::vector<bf16>& v) {
  if constexpr (std::is_same_v<T, bf16>)
    return v;
  else
    return widen_bf16(v);
}

template <class T>
ln_out<T> run_ln(rig& r, const ln_case& k, std::size_t offset = 0) {
  const std::size_t n = static_cast<std::size_t>(k.rows) * k.cols;
  const auto c = static_cast<std::size_t>(k.cols);
  const T* x = r.up(as<T>(k.x), offset);
  const T* g = r.up(as<T>(k.g), offset);
  const T* b = r.up(as<T>(k.b), offset);
  const T* dy = r.up(as<T>(k.dy), offset);
  T* y = r.alloc<T>(n, offset);
  float* mean = r.alloc<float>(k.rows, offset);
  float* rstd = r.alloc<float>(k.rows, offset);
  layer_norm_forward(r.ctx(), r.s(), x, g, b, y, mean, rstd, k.rows, k.cols);
  T* dx = r.alloc<T>(n, offset);
  T* dg = r.alloc<T>(c, offset);
  T* db = r.alloc<T>(c, offset);
  layer_norm_backward(r.ctx(), r.s(), x, g, mean, rstd, dy, dx, dg, db, k.rows, k.cols, false);
  ln_out<T> o;
  o.y = r.down(y, n);
  o.mean = r.down(mean, k.rows);
  o.rstd = r.down(rstd, k.rows);
  o.dx = r.down(dx, n);
  o.dg = r.down(dg, c);
  o.db = r.down(db, c);
  T* dga = r.up(as<T>(k.dg0), offset);
  T* dba = r.up(as<T>(k.db0), offset);
  layer_norm_backward(r.ctx(), r.s(), x, g, mean, rstd, dy, dx, dga, dba, k.rows, k.cols, true);
  o.dg_acc = r.down(dga, c);
  o.db_acc = r.down(dba, c);
  return o;
}

}  // namespace

TEST(Bf16LayerNorm, EveryOutputIsTheRoundedFloat32Result) {
  // 150 columns: more than one 64-column block of the gamma/beta sums, the last one partial.
  const ln_case k(37, 150);
  rig r;
  const auto want = run_ln<float>(r, k);
  const auto got = run_ln<bf16>(r, k);
  expect_same_bits(got.y, round_bf16(want.y), "y");
  expect_same_bits(got.mean, want.mean, "mean");
  expect_same_bits(got.rstd, want.rstd, "rstd");
  expect_same_bits(got.dx, round_bf16(want.dx), "dx");
  expect_same_bits(got.dg, round_bf16(want.dg), "dgamma");
  expect_same_bits(got.db, round_bf16(want.db), "dbeta");
  expect_same_bits(got.dg_acc, round_bf16(want.dg_acc), "dgamma, accumulated");
  expect_same_bits(got.db_acc, round_bf16(want.db_acc), "dbeta, accumulated");
  // The accumulated sums really started from dg0: they differ from the overwritten ones.
  EXPECT_NE(got.dg_acc[0].bits, got.dg[0].bits);
}

TEST(Bf16LayerNorm, RepeatsBitForBitAtOtherAddresses) {
  const ln_case k(19, 300);
  rig r;
  const auto a = run_ln<bf16>(r, k);
  const auto b = run_ln<bf16>(r, k, 3);
  expect_same_bits(b.y, a.y, "y");
  expect_same_bits(b.dx, a.dx, "dx");
  expect_same_bits(b.dg, a.dg, "dgamma");
  expect_same_bits(b.db_acc, a.db_acc, "dbeta, accumulated");
}

TEST(Bf16LayerNormCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const ln_case k(64, 768);
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_ln<bf16>(cpu, k);
  const auto got = run_ln<bf16>(gpu, k);
  // The backends sum in different fixed orders (block trees against a serial loop), so the
  // float32 values differ in their last bits and their bf16 roundings by at most one step.
  expect_near_bf16(got.y, want.y, 1e-3, 1, "y");
  expect_near_all(got.mean, want.mean, 1e-5, 1e-5, "mean");
  expect_near_all(got.rstd, want.rstd, 1e-5, 1e-4, "rstd");
  expect_near_bf16(got.dx, want.dx, 1e-3, 1, "dx");
  expect_near_bf16(got.dg, want.dg, 1e-2, 1, "dgamma");
  expect_near_bf16(got.db_acc, want.db_acc, 1e-2, 1, "dbeta, accumulated");
}
