// bf16 variants of conv2d and causal attention: on the cpu backend each against its float32
// composition on the widened inputs (bit for bit where the arithmetic is the same), workspace
// sizing, repeated runs giving the same bits, and cuda against cpu where a GPU is present.
#include <gtest/gtest.h>

#include <math.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bf16_rig.hpp"
#include "kernels/attention.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/gemm.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

// ---- conv2d ----

struct conv_case {
  conv2d_shape sh;
  std::size_t nx, nw, ny;
  std::vector<bf16> x, w, b, dy, dw0, db0;

  explicit conv_case(const conv2d_shape& shape) : sh(shape) {
    const auto kk = static_cast<std::size_t>(sh.kernel.size) * sh.kernel.size;
    nx = static_cast<std::size_t>(sh.batch) * sh.in_channels * sh.height * sh.width;
    nw = static_cast<std::size_t>(sh.out_channels) * sh.in_channels * kk;
    ny = static_cast<std::size_t>(sh.batch) * sh.out_channels * sh.out_height() * sh.out_width();
    x = random_bf16(nx, 61);
    w = random_bf16(nw, 62);
    b = random_bf16(sh.out_channels, 63);
    dy = random_bf16(ny, 64);
    dw0 = random_bf16(nw, 65);
    db0 = random_bf16(sh.out_channels, 66);
  }
};

template <class T>
struct conv_out {
  std::vector<T> y, dx, dw, db, dw_acc, db_acc;
};

template <class T>
conv_out<T> run_conv(rig& r, const conv_case& k, std::size_t offset = 0) {
  const T* x = r.up(in_storage<T>(k.x), offset);
  const T* w = r.up(in_storage<T>(k.w), offset);
  const T* dy = r.up(in_storage<T>(k.dy), offset);
  conv_out<T> o;
  T* y = r.alloc<T>(k.ny, offset);
  conv2d_forward(r.ctx(), r.s(), k.sh, x, w, r.up(in_storage<T>(k.b), offset), y);
  o.y = r.down(y, k.ny);
  T* dx = r.alloc<T>(k.nx, offset);
  T* dw = r.alloc<T>(k.nw, offset);
  T* db = r.alloc<T>(k.sh.out_channels, offset);
  conv2d_backward(r.ctx(), r.s(), k.sh, x, w, dy, dx, dw, db, false);
  o.dx = r.down(dx, k.nx);
  o.dw = r.down(dw, k.nw);
  o.db = r.down(db, k.sh.out_channels);
  T* dwa = r.up(in_storage<T>(k.dw0), offset);
  T* dba = r.up(in_storage<T>(k.db0), offset);
  conv2d_backward(r.ctx(), r.s(), k.sh, x, w, dy, static_cast<T*>(nullptr), dwa, dba, true);
  o.dw_acc = r.down(dwa, k.nw);
  o.db_acc = r.down(dba, k.sh.out_channels);
  return o;
}

class Bf16ConvShapes : public ::testing::TestWithParam<conv2d_shape> {};

}  // namespace

TEST_P(Bf16ConvShapes, EveryOutputIsTheRoundedFloat32Result) {
  const conv_case k(GetParam());
  rig r;
  const auto want = run_conv<float>(r, k);
  const auto got = run_conv<bf16>(r, k);
  expect_same_bits(got.y, round_bf16(want.y), "y");
  expect_same_bits(got.dx, round_bf16(want.dx), "dx");
  expect_same_bits(got.dw, round_bf16(want.dw), "dw");
  expect_same_bits(got.db, round_bf16(want.db), "dbias");
  expect_same_bits(got.dw_acc, round_bf16(want.dw_acc), "dw, accumulated");
  expect_same_bits(got.db_acc, round_bf16(want.db_acc), "dbias, accumulated");
}

TEST_P(Bf16ConvShapes, RepeatsBitForBitAtOtherAddresses) {
  const conv_case k(GetParam());
  rig r;
  const auto a = run_conv<bf16>(r, k);
  const auto b = run_conv<bf16>(r, k, 13);
  expect_same_bits(b.y, a.y, "y");
  expect_same_bits(b.dx, a.dx, "dx");
  expect_same_bits(b.dw_acc, a.dw_acc, "dw, accumulated");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Bf16ConvShapes,
                         ::testing::Values(conv2d_shape{2, 3, 9, 8, 4, {3, 2, 1}},    // strided, padded
                                           conv2d_shape{3, 5, 6, 6, 2, {1, 1, 0}}));  // 1x1

TEST(Bf16Conv, CpuWidensThroughTheBoundWorkspaceAndSaysHowMuch) {
  const conv_case k(conv2d_shape{2, 3, 9, 8, 4, {3, 2, 1}});
  rig r;
  // float32 w and dw (4 * 27 floats each), one image of y (4 * 5 * 4) and of x (3 * 9 * 8), each
  // rounded up to 256 bytes.
  EXPECT_EQ(conv2d_bf16_workspace_bytes(r.ctx(), k.sh), 2 * 512u + 512u + 1024u);
  EXPECT_EQ(conv2d_workspace_bytes(r.ctx(), k.sh), 0u);  // float32 needs none
  const bf16* x = r.up(k.x);
  const bf16* w = r.up(k.w);
  bf16* y = r.alloc<bf16>(k.ny);
  void* small = r.alloc<char>(256);
  const workspace_scope too_small(r.ctx(), small, 256);
  try {
    conv2d_forward(r.ctx(), r.s(), k.sh, x, w, nullptr, y);
    FAIL() << "a bf16 convolution ran with a workspace too small for its float32 copies";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d_forward needs a workspace of 2560 bytes"), std::string::npos)
        << e.what();
  }
}

TEST(Bf16ConvCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const conv_case k(conv2d_shape{4, 16, 16, 16, 32, {3, 1, 1}});
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_conv<bf16>(cpu, k);
  // The rig's workspace must hold cuDNN's scratch for the bf16 algorithms.
  ASSERT_LE(conv2d_bf16_workspace_bytes(gpu.ctx(), k.sh), rig_workspace_bytes);
  const auto got = run_conv<bf16>(gpu, k);
  // cuDNN sums in its own order, and adds the bias to an already rounded y (a second rounding):
  // two bf16 steps, plus an absolute slack for sums that cancel (terms up to 1, 144 of them).
  expect_near_bf16(got.y, want.y, 2e-2, 2, "y");
  expect_near_bf16(got.dx, want.dx, 2e-2, 1, "dx");
  expect_near_bf16(got.dw, want.dw, 5e-2, 1, "dw");
  expect_near_bf16(got.db, want.db, 5e-2, 1, "dbias");
  expect_near_bf16(got.dw_acc, want.dw_acc, 5e-2, 2, "dw, accumulated");
}

// ---- causal attention ----

namespace {

struct attn_case {
  attention_shape sh{2, 13, 24, 3};  // head size 8
  std::size_t nqkv, nout, nprobs;
  std::vector<bf16> qkv, dout;

  attn_case() {
    nqkv = static_cast<std::size_t>(sh.batch) * sh.seq * 3 * sh.channels;
    nout = static_cast<std::size_t>(sh.batch) * sh.seq * sh.channels;
    nprobs = static_cast<std::size_t>(sh.batch) * sh.heads * sh.seq * sh.seq;
    qkv = random_bf16(nqkv, 71, -2.0f, 2.0f);
    dout = random_bf16(nout, 72);
  }
};

struct attn_out {
  std::vector<bf16> out, probs, dqkv;
};

attn_out run_attn(rig& r, const attn_case& k, std::size_t offset = 0) {
  const bf16* qkv = r.up(k.qkv, offset);
  bf16* out = r.alloc<bf16>(k.nout, offset);
  bf16* probs = r.alloc<bf16>(k.nprobs, offset);
  attention_forward(r.ctx(), r.s(), k.sh, qkv, out, probs);
  bf16* dqkv = r.alloc<bf16>(k.nqkv, offset);
  bf16* scratch = r.alloc<bf16>(k.nprobs, offset);
  attention_backward(r.ctx(), r.s(), k.sh, qkv, probs, r.up(k.dout, offset), dqkv, scratch);
  return {r.down(out, k.nout), r.down(probs, k.nprobs), r.down(dqkv, k.nqkv)};
}

/// Rounds n float32 values of device memory to bf16 values in place (a stage's result).
void round_stage(rig& r, float* d, std::size_t n) {
  const auto h = widen_bf16(round_bf16(r.down(d, n)));
  r.dev().copy_async(d, h.data(), n * sizeof(float), copy_kind::host_to_device, r.s());
  r.sync();
}

/// The attention composition run with the float32 kernels on widened inputs, each stage's
/// result rounded to bf16 before the next stage reads it: what the bf16 kernels promise.
attn_out staged_float32(rig& r, const attn_case& k) {
  const attention_shape& sh = k.sh;
  const int t = sh.seq, c = sh.channels, h = sh.heads, hs = c / h, ld = 3 * c;
  const long long tt = static_cast<long long>(t) * t, bq = static_cast<long long>(t) * ld,
                  bo = static_cast<long long>(t) * c, bp = h * tt;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const float* qkv = r.up(widen_bf16(k.qkv));
  const float* dy = r.up(widen_bf16(k.dout));
  float* probs = r.alloc<float>(k.nprobs);
  float* out = r.alloc<float>(k.nout);
  float* dqkv = r.alloc<float>(k.nqkv);
  float* ds = r.alloc<float>(k.nprobs);
  auto& x = r.ctx();
  for (int b = 0; b < sh.batch; ++b)
    gemm_strided_batched(x, r.s(), transpose::no, transpose::yes, t, t, hs, scale, qkv + b * bq, ld, hs,
                         qkv + b * bq + c, ld, hs, 0.0f, probs + b * bp, t, tt, h);
  round_stage(r, probs, k.nprobs);
  causal_softmax_forward(x, r.s(), probs, sh.batch * h, t);
  round_stage(r, probs, k.nprobs);
  for (int b = 0; b < sh.batch; ++b)
    gemm_strided_batched(x, r.s(), transpose::no, transpose::no, t, hs, t, 1.0f, probs + b * bp, t, tt,
                         qkv + b * bq + 2 * c, ld, hs, 0.0f, out + b * bo, c, hs, h);
  round_stage(r, out, k.nout);
  for (int b = 0; b < sh.batch; ++b) {
    gemm_strided_batched(x, r.s(), transpose::no, transpose::yes, t, t, hs, 1.0f, dy + b * bo, c, hs,
                         qkv + b * bq + 2 * c, ld, hs, 0.0f, ds + b * bp, t, tt, h);
    gemm_strided_batched(x, r.s(), transpose::yes, transpose::no, t, hs, t, 1.0f, probs + b * bp, t, tt,
                         dy + b * bo, c, hs, 0.0f, dqkv + b * bq + 2 * c, ld, hs, h);
  }
  round_stage(r, ds, k.nprobs);
  causal_softmax_backward(x, r.s(), probs, ds, sh.batch * h, t, scale);
  round_stage(r, ds, k.nprobs);
  for (int b = 0; b < sh.batch; ++b) {
    gemm_strided_batched(x, r.s(), transpose::no, transpose::no, t, hs, t, 1.0f, ds + b * bp, t, tt,
                         qkv + b * bq + c, ld, hs, 0.0f, dqkv + b * bq, ld, hs, h);
    gemm_strided_batched(x, r.s(), transpose::yes, transpose::no, t, hs, t, 1.0f, ds + b * bp, t, tt,
                         qkv + b * bq, ld, hs, 0.0f, dqkv + b * bq + c, ld, hs, h);
  }
  return {round_bf16(r.down(out, k.nout)), round_bf16(r.down(probs, k.nprobs)), round_bf16(r.down(dqkv, k.nqkv))};
}

}  // namespace

TEST(Bf16Attention, IsTheFloat32CompositionRoundedAtEachStage) {
  const attn_case k;
  rig r;
  ASSERT_GT(attention_bf16_workspace_bytes(r.ctx(), k.sh), 0u);  // the cpu GEMMs widen into it
  ASSERT_LE(attention_bf16_workspace_bytes(r.ctx(), k.sh), rig_workspace_bytes);
  const auto want = staged_float32(r, k);
  const auto got = run_attn(r, k);
  expect_same_bits(got.probs, want.probs, "probs");
  expect_same_bits(got.out, want.out, "out");
  expect_same_bits(got.dqkv, want.dqkv, "dqkv");
}

TEST(Bf16Attention, StaysCloseToFloat32) {
  // Rounding at each stage moves the result by a few bf16 steps from the float32 attention on
  // the same (widened) inputs, not more: a check that the stages are wired as in float32.
  const attn_case k;
  rig r;
  const auto got = run_attn(r, k);
  const float* qkv = r.up(widen_bf16(k.qkv));
  float* out = r.alloc<float>(k.nout);
  float* probs = r.alloc<float>(k.nprobs);
  attention_forward(r.ctx(), r.s(), k.sh, qkv, out, probs);
  float* dqkv = r.alloc<float>(k.nqkv);
  float* scratch = r.alloc<float>(k.nprobs);
  attention_backward(r.ctx(), r.s(), k.sh, qkv, probs, r.up(widen_bf16(k.dout)), dqkv, scratch);
  expect_near_all(widen_bf16(got.probs), r.down(probs, k.nprobs), 2e-2, 3.0 / 128, "probs");
  expect_near_all(widen_bf16(got.out), r.down(out, k.nout), 3e-2, 3.0 / 128, "out");
  expect_near_all(widen_bf16(got.dqkv), r.down(dqkv, k.nqkv), 5e-2, 4.0 / 128, "dqkv");
}

TEST(Bf16Attention, RepeatsBitForBitAtOtherAddresses) {
  const attn_case k;
  rig r;
  const auto a = run_attn(r, k);
  const auto b = run_attn(r, k, 17);
  expect_same_bits(b.out, a.out, "out");
  expect_same_bits(b.dqkv, a.dqkv, "dqkv");
}

TEST(Bf16AttentionCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  attn_case k;
  k.sh = attention_shape{2, 64, 128, 4};
  k.nqkv = static_cast<std::size_t>(2) * 64 * 3 * 128;
  k.nout = static_cast<std::size_t>(2) * 64 * 128;
  k.nprobs = static_cast<std::size_t>(2) * 4 * 64 * 64;
  k.qkv = random_bf16(k.nqkv, 73, -2.0f, 2.0f);
  k.dout = random_bf16(k.nout, 74);
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_attn(cpu, k);
  const auto got = run_attn(gpu, k);
  // cuBLAS and OpenBLAS sum in different orders, and a one-step difference at one stage can
  // carry into the next: a few bf16 steps, plus absolute slack for sums that cancel.
  expect_near_bf16(got.probs, want.probs, 1e-2, 4, "probs");
  expect_near_bf16(got.out, want.out, 3e-2, 4, "out");
  expect_near_bf16(got.dqkv, want.dqkv, 5e-2, 6, "dqkv");
}
