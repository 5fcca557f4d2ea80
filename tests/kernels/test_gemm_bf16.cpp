// The bf16 GEMM and linear layer: on the cpu backend exactly the float32 GEMM (cblas_sgemm) on
// the widened inputs, rounded once for a bf16 C; the workspace it needs and the error when too
// little is bound; cuda against cpu where a GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "bf16_rig.hpp"
#include "kernel_rig.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/gemm.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

transpose tr(bool t) { return t ? transpose::yes : transpose::no; }

struct gemm_shape {
  bool ta, tb;
  int m, n, k, lda, ldb, ldc;
  [[nodiscard]] std::size_t a_size() const { return static_cast<std::size_t>((ta ? k : m) * lda); }
  [[nodiscard]] std::size_t b_size() const { return static_cast<std::size_t>((tb ? n : k) * ldb); }
  [[nodiscard]] std::size_t c_size() const { return static_cast<std::size_t>(m * ldc); }
};

gemm_shape padded(bool ta, bool tb, int m, int n, int k) {
  return {ta, tb, m, n, k, (ta ? m : k) + 3, (tb ? k : n) + 5, n + 2};
}

/// The float32 GEMM (the library's, over cblas_sgemm) on float32 operands.
std::vector<float> gemm_f32(rig& r, const gemm_shape& g, float alpha, const std::vector<float>& a,
                            const std::vector<float>& b, float beta, const std::vector<float>& c) {
  float* dc = r.up(c);
  gemm(r.ctx(), r.s(), tr(g.ta), tr(g.tb), g.m, g.n, g.k, alpha, r.up(a), g.lda, r.up(b), g.ldb, beta, dc, g.ldc);
  return r.down(dc, c.size());
}

/// The bf16 GEMM with C of type TC.
template <class TC>
std::vector<TC> gemm_bf16(rig& r, const gemm_shape& g, float alpha, const std::vector<bf16>& a,
                          const std::vector<bf16>& b, float beta, const std::vector<TC>& c) {
  TC* dc = r.up(c);
  gemm(r.ctx(), r.s(), tr(g.ta), tr(g.tb), g.m, g.n, g.k, alpha, r.up(a), g.lda, r.up(b), g.ldb, beta, dc, g.ldc);
  return r.down(dc, c.size());
}

class GemmBf16Transpose : public ::testing::TestWithParam<std::pair<bool, bool>> {};

}  // namespace

TEST_P(GemmBf16Transpose, CpuEqualsFloat32GemmOnWidenedInputs) {
  const auto [ta, tb] = GetParam();
  const gemm_shape g = padded(ta, tb, 37, 29, 53);
  const auto a = round_bf16(random_floats(g.a_size(), 1));
  const auto b = round_bf16(random_floats(g.b_size(), 2));
  const auto c16 = round_bf16(random_floats(g.c_size(), 3));
  const auto c32 = random_floats(g.c_size(), 4);
  rig r;
  for (const float beta : {0.5f, 0.0f}) {
    const std::string what = "beta " + std::to_string(beta);
    // float32 C: the float32 GEMM's bits exactly.
    expect_same_bits(gemm_bf16(r, g, 0.75f, a, b, beta, c32),
                     gemm_f32(r, g, 0.75f, widen_bf16(a), widen_bf16(b), beta, c32), what + ", float C");
    // bf16 C: the float32 GEMM over the widened C, rounded once (padding columns stay as they were,
    // which rounding their unchanged widened values reproduces).
    expect_same_bits(gemm_bf16(r, g, 0.75f, a, b, beta, c16),
                     round_bf16(gemm_f32(r, g, 0.75f, widen_bf16(a), widen_bf16(b), beta, widen_bf16(c16))),
                     what + ", bf16 C");
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmBf16Transpose,
                         ::testing::Values(std::pair{false, false}, std::pair{false, true}, std::pair{true, false},
                                           std::pair{true, true}));

TEST(GemmBf16, ProductsAreSummedInFloat32) {
  // 1 + 2^-8 + 2^-8: a bf16 running sum would lose each 2^-8 (half its unit 2^-7 at 1, a tie
  // that rounds to even); in float32 they add up to 2^-7, which the rounding at the end keeps.
  const std::vector<float> a = {1.0f, 1.0f, 1.0f};
  const std::vector<float> b = {1.0f, std::ldexp(1.0f, -8), std::ldexp(1.0f, -8)};
  rig r;
  bf16* c = r.alloc<bf16>(1);
  gemm(r.ctx(), r.s(), transpose::no, transpose::no, 1, 1, 3, 1.0f, r.up(round_bf16(a)), r.up(round_bf16(b)), 0.0f, c);
  EXPECT_EQ(to_float(r.down(c, 1)[0]), 1.0f + std::ldexp(1.0f, -7));
}

TEST(GemmBf16, BetaZeroIgnoresNaNAndZeroInnerDimensionScalesC) {
  const gemm_shape g = padded(false, false, 4, 5, 3);
  const auto a = round_bf16(random_floats(g.a_size(), 5));
  const auto b = round_bf16(random_floats(g.b_size(), 6));
  rig r;
  const auto got = gemm_bf16(r, g, 1.0f, a, b, 0.0f, std::vector<bf16>(g.c_size(), to_bf16(std::nanf(""))));
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) EXPECT_FALSE(std::isnan(to_float(got[i * g.ldc + j]))) << i << "," << j;

  std::vector<bf16> c = round_bf16({1, 2, 3, 4});
  bf16* dc = r.up(c);
  gemm(r.ctx(), r.s(), transpose::no, transpose::no, 2, 2, 0, 1.0f, dc, 1, dc, 2, 3.0f, dc, 2);
  EXPECT_EQ(widen_bf16(r.down(dc, 4)), (std::vector<float>{3, 6, 9, 12}));
  bf16* nan_c = r.up(std::vector<bf16>(4, to_bf16(std::nanf(""))));
  gemm(r.ctx(), r.s(), transpose::no, transpose::no, 2, 2, 0, 1.0f, dc, 1, dc, 2, 0.0f, nan_c, 2);
  EXPECT_EQ(widen_bf16(r.down(nan_c, 4)), (std::vector<float>{0, 0, 0, 0}));
}

TEST(GemmBf16, StridedBatchedEqualsOneGemmPerBatch) {
  const int m = 6, n = 7, k = 5, batch = 4;
  const auto a = round_bf16(random_floats(batch * m * k, 7));
  const auto b = round_bf16(random_floats(batch * k * n, 8));
  rig r;
  const bf16* da = r.up(a);
  const bf16* db = r.up(b);
  bf16* dc = r.alloc<bf16>(batch * m * n);
  gemm_strided_batched(r.ctx(), r.s(), transpose::no, transpose::no, m, n, k, 1.0f, da, k, m * k, db, n, k * n, 0.0f,
                       dc, n, m * n, batch);
  float* dc32 = r.alloc<float>(batch * m * n);
  gemm_strided_batched(r.ctx(), r.s(), transpose::no, transpose::no, m, n, k, 1.0f, da, k, m * k, db, n, k * n, 0.0f,
                       dc32, n, m * n, batch);
  const auto got = r.down(dc, batch * m * n);
  const auto got32 = r.down(dc32, batch * m * n);
  const gemm_shape g{false, false, m, n, k, k, n, n};
  const auto a32 = widen_bf16(a), b32 = widen_bf16(b);
  for (int i = 0; i < batch; ++i) {
    const std::vector<float> ai(a32.begin() + i * m * k, a32.begin() + (i + 1) * m * k);
    const std::vector<float> bi(b32.begin() + i * k * n, b32.begin() + (i + 1) * k * n);
    const auto want = gemm_f32(r, g, 1.0f, ai, bi, 0.0f, std::vector<float>(m * n));
    const std::string what = "batch " + std::to_string(i);
    expect_same_bits(std::vector<bf16>(got.begin() + i * m * n, got.begin() + (i + 1) * m * n), round_bf16(want), what);
    expect_same_bits(std::vector<float>(got32.begin() + i * m * n, got32.begin() + (i + 1) * m * n), want, what);
  }
}

TEST(GemmBf16, RepeatsBitForBitAtOtherAddresses) {
  const gemm_shape g = padded(true, false, 33, 21, 47);
  const auto a = random_bf16(g.a_size(), 17);
  const auto b = random_bf16(g.b_size(), 18);
  const auto c = random_bf16(g.c_size(), 19);
  rig r;
  auto run = [&](std::size_t offset) {
    bf16* dc = r.up(c, offset);
    gemm(r.ctx(), r.s(), transpose::yes, transpose::no, g.m, g.n, g.k, 1.25f, r.up(a, offset), g.lda,
         r.up(b, offset), g.ldb, -0.5f, dc, g.ldc);
    return r.down(dc, c.size());
  };
  const auto first = run(0);
  expect_same_bits(run(0), first, "again");
  expect_same_bits(run(3), first, "3 elements further on");
  expect_same_bits(run(129), first, "129 elements further on");
}

TEST(GemmBf16, NeedsTheWorkspaceItsSizeFunctionNames) {
  const int m = 40, n = 30, k = 20;
  rig r;
  const std::size_t need = gemm_bf16_workspace_bytes(r.ctx(), m, n, k);
  // A, B and C widened: at least their float32 sizes, at most 64 bytes of padding each.
  EXPECT_GE(need, sizeof(float) * (m * k + k * n + m * n));
  EXPECT_LE(need, sizeof(float) * (m * k + k * n + m * n) + 3 * 64);
  EXPECT_EQ(linear_bf16_workspace_bytes(r.ctx(), m, k, n), need);  // rows m, in k, out n
  const bf16* a = r.up(round_bf16(random_floats(m * k, 9)));
  const bf16* b = r.up(round_bf16(random_floats(k * n, 10)));
  bf16* c = r.alloc<bf16>(m * n);
  void* ws = r.dev().allocate(need);
  {
    workspace_scope exact(r.ctx(), ws, need);
    gemm(r.ctx(), r.s(), transpose::no, transpose::no, m, n, k, 1.0f, a, b, 0.0f, c);
    r.sync();
  }
  {
    workspace_scope short_by_one(r.ctx(), ws, need - 256);
    try {
      gemm(r.ctx(), r.s(), transpose::no, transpose::no, m, n, k, 1.0f, a, b, 0.0f, c);
      ADD_FAILURE() << "the bf16 gemm ran with less workspace than it needs";
    } catch (const spillway::usage_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("gemm (bf16) needs a workspace of " + std::to_string(need) + " bytes"), std::string::npos)
          << msg;
    }
  }
  r.sync();
  r.dev().deallocate(ws, need);
}

namespace {

struct linear_data {
  int rows = 9, in = 11, out = 6;
  std::vector<bf16> x, w, bias, dy, dw0, db0;
  linear_data()
      : x(round_bf16(random_floats(rows * in, 11))),
        w(round_bf16(random_floats(out * in, 12))),
        bias(round_bf16(random_floats(out, 13))),
        dy(round_bf16(random_floats(rows * out, 14))),
        dw0(round_bf16(random_floats(out * in, 15))),
        db0(round_bf16(random_floats(out, 16))) {}
};

struct linear_result {
  std::vector<bf16> y, dx, dw, dbias;
};

linear_result run_linear(rig& r, const linear_data& d) {
  const bf16* x = r.up(d.x);
  const bf16* w = r.up(d.w);
  bf16* y = r.alloc<bf16>(d.rows * d.out);
  linear_forward(r.ctx(), r.s(), x, w, r.up(d.bias), y, d.rows, d.in, d.out);
  bf16* dx = r.alloc<bf16>(d.rows * d.in);
  bf16* dw = r.up(d.dw0);
  bf16* db = r.up(d.db0);
  linear_backward(r.ctx(), r.s(), x, w, r.up(d.dy), dx, dw, db, d.rows, d.in, d.out, true);
  return {r.down(y, d.rows * d.out), r.down(dx, d.rows * d.in), r.down(dw, d.out * d.in), r.down(db, d.out)};
}

}  // namespace

TEST(LinearBf16, CpuEqualsTheFloat32KernelsOnWidenedInputs) {
  const linear_data d;
  rig r;
  const auto got = run_linear(r, d);
  // Forward: the GEMM rounds y once, then the bias add rounds again.
  float* y = r.alloc<float>(d.rows * d.out);
  gemm(r.ctx(), r.s(), transpose::no, transpose::yes, d.rows, d.out, d.in, 1.0f, r.up(widen_bf16(d.x)),
       r.up(widen_bf16(d.w)), 0.0f, y);
  float* yr = r.up(widen_bf16(round_bf16(r.down(y, d.rows * d.out))));
  bias_add(r.ctx(), r.s(), yr, r.up(widen_bf16(d.bias)), d.rows, d.out);
  expect_same_bits(got.y, round_bf16(r.down(yr, d.rows * d.out)), "y");
  // Backward (accumulating into dw and dbias): each output is the float32 kernel's, rounded once.
  const float* x32 = r.up(widen_bf16(d.x));
  float* dx = r.alloc<float>(d.rows * d.in);
  float* dw = r.up(widen_bf16(d.dw0));
  float* db = r.up(widen_bf16(d.db0));
  linear_backward(r.ctx(), r.s(), x32, r.up(widen_bf16(d.w)), r.up(widen_bf16(d.dy)), dx, dw, db, d.rows, d.in, d.out,
                  true);
  expect_same_bits(got.dx, round_bf16(r.down(dx, d.rows * d.in)), "dx");
  expect_same_bits(got.dw, round_bf16(r.down(dw, d.out * d.in)), "dw");
  expect_same_bits(got.dbias, round_bf16(r.down(db, d.out)), "dbias");
}

TEST(GemmBf16Cuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  rig cpu("cpu"), gpu("cuda");
  EXPECT_EQ(gemm_bf16_workspace_bytes(gpu.ctx(), 65, 33, 129), 0u);
  for (const auto& [ta, tb] : {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
    const gemm_shape g = padded(ta, tb, 65, 33, 129);
    const auto a = round_bf16(random_floats(g.a_size(), 21));
    const auto b = round_bf16(random_floats(g.b_size(), 22));
    const auto c = round_bf16(random_floats(g.c_size(), 23));
    const std::string what = "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
    // Same inputs, summed in another order: float32 C agrees to float32 rounding, bf16 C to
    // about one bf16 unit (2^-8 relative) more.
    expect_near_all(gemm_bf16(gpu, g, 1.5f, a, b, 0.25f, widen_bf16(c)),
                    gemm_bf16(cpu, g, 1.5f, a, b, 0.25f, widen_bf16(c)), 1e-4, 1e-4, what + ", float C");
    expect_near_all(widen_bf16(gemm_bf16(gpu, g, 1.5f, a, b, 0.25f, c)),
                    widen_bf16(gemm_bf16(cpu, g, 1.5f, a, b, 0.25f, c)), 1e-3, 8e-3, what + ", bf16 C");
  }
  const int m = 6, n = 7, k = 5, batch = 3;
  const auto a = round_bf16(random_floats(batch * m * k, 24));
  const auto b = round_bf16(random_floats(batch * k * n, 25));
  auto batched = [&](rig& r) {
    bf16* c = r.alloc<bf16>(batch * m * n);
    gemm_strided_batched(r.ctx(), r.s(), transpose::no, transpose::yes, m, n, k, 1.0f, r.up(a), k, m * k, r.up(b), k,
                         k * n, 0.0f, c, n, m * n, batch);
    return widen_bf16(r.down(c, batch * m * n));
  };
  expect_near_all(batched(gpu), batched(cpu), 1e-3, 8e-3, "strided batched");
  const linear_data d;
  const auto want = run_linear(cpu, d);
  const auto got = run_linear(gpu, d);
  // y is rounded twice (after the GEMM, after the bias): a one-unit difference in the GEMM's
  // rounding survives a bias that cancels most of it, so y gets an absolute bound, a unit or two
  // at the largest |x w^T| these shapes give.
  expect_near_all(widen_bf16(got.y), widen_bf16(want.y), 4e-2, 8e-3, "y");
  expect_near_all(widen_bf16(got.dx), widen_bf16(want.dx), 1e-3, 8e-3, "dx");
  expect_near_all(widen_bf16(got.dw), widen_bf16(want.dw), 1e-3, 8e-3, "dw");
  expect_same_bits(got.dbias, want.dbias, "dbias");  // one thread per column, rows in order, on both
}
