// GEMM and the linear layer: every transpose against a float64 reference, leading dimensions,
// alpha/beta, strided batches, linear backward by finite differences, cuda against cpu.
#include <gtest/gtest.h>

#include <string>

#include "kernel_rig.hpp"
#include "kernels/gemm.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

/// Row-major reference: C = alpha op(A) op(B) + beta C.
std::vector<double> ref_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const std::vector<float>& a,
                             int lda, const std::vector<float>& b, int ldb, double beta,
                             const std::vector<float>& c, int ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        const double av = ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        sum += av * bv;
      }
      out[i * ldc + j] = alpha * sum + beta * c[i * ldc + j];
    }
  return out;
}

struct gemm_case {
  bool ta, tb;
};

class GemmTranspose : public ::testing::TestWithParam<gemm_case> {};

std::vector<float> run_gemm(rig& r, bool ta, bool tb, int m, int n, int k, float alpha, float beta,
                            const std::vector<float>& a, int lda, const std::vector<float>& b, int ldb,
                            const std::vector<float>& c, int ldc) {
  const float* da = r.up(a);
  const float* db = r.up(b);
  float* dc = r.up(c);
  gemm(r.ctx(), r.s(), ta ? transpose::yes : transpose::no, tb ? transpose::yes : transpose::no, m, n, k,
       alpha, da, lda, db, ldb, beta, dc, ldc);
  return r.down(dc, c.size());
}

}  // namespace

TEST_P(GemmTranspose, MatchesFloat64ReferenceWithPaddedLeadingDimensions) {
  const auto [ta, tb] = GetParam();
  const int m = 37, n = 29, k = 53;
  const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
  const auto a = random_floats(static_cast<std::size_t>((ta ? k : m) * lda), 1);
  const auto b = random_floats(static_cast<std::size_t>((tb ? n : k) * ldb), 2);
  const auto c = random_floats(static_cast<std::size_t>(m * ldc), 3);
  rig r;
  const auto got = run_gemm(r, ta, tb, m, n, k, 0.75f, 0.5f, a, lda, b, ldb, c, ldc);
  const auto want = ref_gemm(ta, tb, m, n, k, 0.75, a, lda, b, ldb, 0.5, c, ldc);
  expect_near_all(got, want, 1e-4, 1e-5);
  // The padding columns of C are not touched.
  for (int i = 0; i < m; ++i)
    for (int j = n; j < ldc; ++j) EXPECT_EQ(got[i * ldc + j], c[i * ldc + j]);
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTranspose,
                         ::testing::Values(gemm_case{false, false}, gemm_case{false, true},
                                           gemm_case{true, false}, gemm_case{true, true}));

TEST(Gemm, BetaZeroIgnoresNaNInC) {
  const int m = 4, n = 5, k = 3;
  const auto a = random_floats(m * k, 4);
  const auto b = random_floats(k * n, 5);
  std::vector<float> c(m * n, std::nanf(""));
  rig r;
  const auto got = run_gemm(r, false, false, m, n, k, 1.0f, 0.0f, a, k, b, n, c, n);
  const auto want = ref_gemm(false, false, m, n, k, 1.0, a, k, b, n, 0.0, std::vector<float>(m * n, 0.0f), n);
  expect_near_all(got, want, 1e-5);
}

TEST(Gemm, ZeroInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  rig r;
  float* dc = r.up(c);
  gemm(r.ctx(), r.s(), transpose::no, transpose::no, 2, 2, 0, 1.0f, dc, 1, dc, 2, 3.0f, dc, 2);
  EXPECT_EQ(r.down(dc, 4), (std::vector<float>{3, 6, 9, 12}));
}

TEST(Gemm, StridedBatchedMatchesOneGemmPerBatch) {
  const int m = 6, n = 7, k = 5, batch = 4;
  const auto a = random_floats(batch * m * k, 6);
  const auto b = random_floats(batch * k * n, 7);
  rig r;
  const float* da = r.up(a);
  const float* db = r.up(b);
  float* dc = r.alloc<float>(batch * m * n);
  gemm_strided_batched(r.ctx(), r.s(), transpose::no, transpose::no, m, n, k, 1.0f, da, k, m * k, db, n,
                       k * n, 0.0f, dc, n, m * n, batch);
  const auto got = r.down(dc, batch * m * n);
  for (int i = 0; i < batch; ++i) {
    std::vector<float> ai(a.begin() + i * m * k, a.begin() + (i + 1) * m * k);
    std::vector<float> bi(b.begin() + i * k * n, b.begin() + (i + 1) * k * n);
    const auto want = ref_gemm(false, false, m, n, k, 1.0, ai, k, bi, n, 0.0, std::vector<float>(m * n), n);
    std::vector<float> gi(got.begin() + i * m * n, got.begin() + (i + 1) * m * n);
    expect_near_all(gi, want, 1e-5, 0, "batch " + std::to_string(i));
  }
}

TEST(Gemm, RejectsLeadingDimensionsThatAreTooSmall) {
  rig r;
  float* d = r.alloc<float>(64);
  EXPECT_THROW(gemm(r.ctx(), r.s(), transpose::no, transpose::no, 4, 4, 4, 1.0f, d, 3, d, 4, 0.0f, d, 4), spillway::usage_error);
  EXPECT_THROW(gemm(r.ctx(), r.s(), transpose::yes, transpose::no, 4, 4, 2, 1.0f, d, 3, d, 4, 0.0f, d, 4), spillway::usage_error);
  EXPECT_THROW(gemm(r.ctx(), r.s(), transpose::no, transpose::no, 4, 4, 4, 1.0f, d, 4, d, 4, 0.0f, d, 3), spillway::usage_error);
  // The message names the kernel and the condition its arguments broke, and where it was checked.
  try {
    gemm(r.ctx(), r.s(), transpose::no, transpose::no, 4, 4, 4, 1.0f, d, 3, d, 4, 0.0f, d, 4);
    ADD_FAILURE() << "gemm accepted lda 3 for k 4";
  } catch (const spillway::usage_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gemm: lda too small"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lda >="), std::string::npos) << msg;
    EXPECT_NE(msg.find(" [at kernels/gemm.cpp:"), std::string::npos) << msg;
  }
}

namespace {

// Loss of a linear layer for finite differences: L = sum(r * (x w^T + bias)).
double linear_loss(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& bias,
                   const std::vector<double>& rr, int rows, int in, int out) {
  double l = 0;
  for (int i = 0; i < rows; ++i)
    for (int o = 0; o < out; ++o) {
      double y = bias[o];
      for (int p = 0; p < in; ++p) y += x[i * in + p] * w[o * in + p];
      l += rr[i * out + o] * y;
    }
  return l;
}

}  // namespace

TEST(Linear, ForwardAndBackwardMatchFiniteDifferences) {
  const int rows = 5, in = 7, out = 4;
  const auto x = random_floats(rows * in, 10);
  const auto w = random_floats(out * in, 11);
  const auto bias = random_floats(out, 12);
  const auto rr = random_floats(rows * out, 13);  // upstream gradient dL/dy
  rig r;
  const float* dx_in = r.up(x);
  const float* dw_in = r.up(w);
  const float* db_in = r.up(bias);
  float* y = r.alloc<float>(rows * out);
  linear_forward(r.ctx(), r.s(), dx_in, dw_in, db_in, y, rows, in, out);
  const auto yv = r.down(y, rows * out);
  for (int i = 0; i < rows; ++i)
    for (int o = 0; o < out; ++o) {
      double want = bias[o];
      for (int p = 0; p < in; ++p) want += double(x[i * in + p]) * w[o * in + p];
      EXPECT_NEAR(yv[i * out + o], want, 1e-5);
    }

  const float* dy = r.up(rr);
  float* gx = r.alloc<float>(rows * in);
  float* gw = r.alloc<float>(out * in);
  float* gb = r.alloc<float>(out);
  linear_backward(r.ctx(), r.s(), dx_in, dw_in, dy, gx, gw, gb, rows, in, out, false);
  const auto X = widen(x), W = widen(w), B = widen(bias), R = widen(rr);
  expect_near_all(r.down(gx, rows * in),
                  numeric_gradient([&](const auto& v) { return linear_loss(v, W, B, R, rows, in, out); }, X),
                  1e-4, 1e-4, "dx");
  expect_near_all(r.down(gw, out * in),
                  numeric_gradient([&](const auto& v) { return linear_loss(X, v, B, R, rows, in, out); }, W),
                  1e-4, 1e-4, "dw");
  expect_near_all(r.down(gb, out),
                  numeric_gradient([&](const auto& v) { return linear_loss(X, W, v, R, rows, in, out); }, B),
                  1e-4, 1e-4, "dbias");

  // accumulate adds a second identical gradient.
  const auto gw1 = r.down(gw, out * in);
  linear_backward(r.ctx(), r.s(), dx_in, dw_in, dy, nullptr, gw, gb, rows, in, out, true);
  const auto gw2 = r.down(gw, out * in);
  for (int i = 0; i < out * in; ++i) EXPECT_NEAR(gw2[i], 2 * gw1[i], 1e-5);
}

TEST(GemmCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  for (const auto& [ta, tb] : {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
    const int m = 65, n = 33, k = 129;
    const int lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
    const auto a = random_floats(static_cast<std::size_t>(m * k), 21);
    const auto b = random_floats(static_cast<std::size_t>(k * n), 22);
    const auto c = random_floats(static_cast<std::size_t>(m * n), 23);
    rig cpu("cpu"), gpu("cuda");
    const auto want = run_gemm(cpu, ta, tb, m, n, k, 1.5f, 0.25f, a, lda, b, ldb, c, ldc);
    const auto got = run_gemm(gpu, ta, tb, m, n, k, 1.5f, 0.25f, a, lda, b, ldb, c, ldc);
    expect_near_all(got, want, 1e-4, 1e-4, "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
  }
}
