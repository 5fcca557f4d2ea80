// Softmax with cross-entropy: losses and their mean against float64, the gradient by finite
// differences, ignored rows, a bad target reported at synchronize, cuda against cpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernel_rig.hpp"
#include "kernels/softmax_cross_entropy.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

double row_loss(const std::vector<double>& x, int row, int cols, int target) {
  double mx = -1e300;
  for (int j = 0; j < cols; ++j) mx = std::max(mx, x[row * cols + j]);
  double sum = 0;
  for (int j = 0; j < cols; ++j) sum += std::exp(x[row * cols + j] - mx);
  return std::log(sum) + mx - x[row * cols + target];
}

double mean_loss_ref(const std::vector<double>& x, const std::vector<std::int32_t>& t, int rows, int cols) {
  double l = 0;
  for (int r = 0; r < rows; ++r)
    if (t[r] >= 0) l += row_loss(x, r, cols, t[r]);
  return l / rows;
}

}  // namespace

TEST(SoftmaxCrossEntropy, LossesMeanAndGradientMatchFloat64) {
  const int rows = 6, cols = 11;
  const auto x = random_floats(rows * cols, 1, -3.0f, 3.0f);
  const auto t = random_ids(rows, cols, 2);
  rig r;
  const float* dx = r.up(x);
  const std::int32_t* dt = r.up(t);
  float* losses = r.alloc<float>(rows);
  float* mean = r.alloc<float>(1);
  float* grad = r.alloc<float>(rows * cols);
  softmax_cross_entropy(r.ctx(), r.s(), dx, dt, losses, mean, grad, rows, cols, 1.0f / rows);
  const auto X = widen(x);
  std::vector<double> want(rows);
  for (int i = 0; i < rows; ++i) want[i] = row_loss(X, i, cols, t[i]);
  expect_near_all(r.down(losses, rows), want, 1e-5, 1e-5, "losses");
  EXPECT_NEAR(r.down(mean, 1)[0], mean_loss_ref(X, t, rows, cols), 1e-5);
  expect_near_all(r.down(grad, rows * cols),
                  numeric_gradient([&](const auto& v) { return mean_loss_ref(v, t, rows, cols); }, X), 1e-5,
                  1e-3, "dlogits");
}

TEST(SoftmaxCrossEntropy, LargeLogitsStayFiniteAndGradientMayAliasLogits) {
  const int rows = 2, cols = 3;
  const std::vector<float> x = {1000.0f, 0.0f, -1000.0f, 5.0f, 5.0f, 5.0f};
  const std::vector<std::int32_t> t = {0, 2};
  rig r;
  float* dx = r.up(x);
  float* losses = r.alloc<float>(rows);
  softmax_cross_entropy(r.ctx(), r.s(), dx, r.up(t), losses, nullptr, dx, rows, cols, 1.0f);
  const auto l = r.down(losses, rows);
  EXPECT_NEAR(l[0], 0.0, 1e-6);
  EXPECT_NEAR(l[1], std::log(3.0), 1e-6);
  const auto g = r.down(dx, rows * cols);
  EXPECT_NEAR(g[0], 0.0, 1e-6);
  EXPECT_NEAR(g[5], 1.0 / 3 - 1, 1e-6);
  EXPECT_NEAR(g[3], 1.0 / 3, 1e-6);
}

TEST(SoftmaxCrossEntropy, NegativeTargetIgnoresTheRow) {
  const int rows = 3, cols = 4;
  const auto x = random_floats(rows * cols, 3);
  const std::vector<std::int32_t> t = {1, -1, 3};
  rig r;
  float* losses = r.alloc<float>(rows);
  float* mean = r.alloc<float>(1);
  float* grad = r.alloc<float>(rows * cols);
  softmax_cross_entropy(r.ctx(), r.s(), r.up(x), r.up(t), losses, mean, grad, rows, cols, 1.0f);
  const auto l = r.down(losses, rows);
  EXPECT_EQ(l[1], 0.0f);
  EXPECT_GT(l[0], 0.0f);
  EXPECT_FLOAT_EQ(r.down(mean, 1)[0], (l[0] + l[2]) / 3);
  const auto g = r.down(grad, rows * cols);
  for (int j = 0; j < cols; ++j) EXPECT_EQ(g[cols + j], 0.0f);
}

TEST(SoftmaxCrossEntropy, TargetPastTheClassesIsReportedAtSynchronize) {
  rig r;
  const std::vector<float> x(4, 0.0f);
  float* losses = r.alloc<float>(2);
  softmax_cross_entropy(r.ctx(), r.s(), r.up(x), r.up(std::vector<std::int32_t>{0, 2}), losses, nullptr,
                        nullptr, 2, 2, 1.0f);
  EXPECT_THROW(r.sync(), spillway::usage_error);
}

namespace {
// The launch returns; the next synchronize of the stream throws a usage_error naming the first
// bad row (row 2: target 7 of 4 classes), and the failure stays. Rows with a negative target,
// -1 or -100 (PyTorch's ignore_index), are ignored, not errors. Returns the message.
std::string past_the_classes_error(rig& r) {
  const int rows = 5, cols = 4;
  const auto x = random_floats(rows * cols, 12);
  const std::vector<std::int32_t> t = {1, -100, 7, 3, 9};
  float* mean = r.alloc<float>(1);
  float* grad = r.alloc<float>(rows * cols);
  softmax_cross_entropy(r.ctx(), r.s(), r.up(x), r.up(t), nullptr, mean, grad, rows, cols, 1.0f / rows);
  std::string what;
  try {
    r.sync();
    ADD_FAILURE() << "target 7 of 4 classes went by";
  } catch (const spillway::usage_error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("target 7 of row 2 is past the 4 classes"), std::string::npos) << what;
  EXPECT_THROW(r.sync(), spillway::usage_error) << "the failure is sticky";
  return what;
}

// Launches with every target fine and no synchronize between them: none reports anything. On
// the cuda backend 1500 launches are more than a page of report slots holds; they are queued
// faster than their host functions free the slots, so the pool usually takes another page.
void many_good_launches(rig& r, int launches) {
  const int rows = 3, cols = 5;
  const float* x = r.up(random_floats(rows * cols, 13));
  const std::int32_t* t = r.up(std::vector<std::int32_t>{4, -1, 0});
  float* losses = r.alloc<float>(rows);
  for (int i = 0; i < launches; ++i)
    softmax_cross_entropy(r.ctx(), r.s(), x, t, losses, nullptr, nullptr, rows, cols, 1.0f);
  EXPECT_NO_THROW(r.sync());
}
}  // namespace

TEST(SoftmaxCrossEntropy, TheFirstTargetPastTheClassesIsNamedAndNegativeTargetsAreIgnored) {
  rig r;
  many_good_launches(r, 3);
  (void)past_the_classes_error(r);
}

TEST(SoftmaxCrossEntropyCuda, TargetPastTheClassesIsReportedAtSynchronizeAsOnTheCpu) {
  SPILLWAY_NEEDS_CUDA();
  rig cpu("cpu"), gpu("cuda");
  many_good_launches(gpu, 1500);
  EXPECT_EQ(past_the_classes_error(gpu), past_the_classes_error(cpu));
}

TEST(SoftmaxCrossEntropyCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const int rows = 37, cols = 1031;
  const auto x = random_floats(rows * cols, 4, -5.0f, 5.0f);
  auto t = random_ids(rows, cols, 5);
  t[3] = -1;
  auto run = [&](rig& r) {
    float* losses = r.alloc<float>(rows);
    float* mean = r.alloc<float>(1);
    float* grad = r.alloc<float>(rows * cols);
    softmax_cross_entropy(r.ctx(), r.s(), r.up(x), r.up(t), losses, mean, grad, rows, cols, 1.0f / rows);
    auto out = r.down(grad, rows * cols);
    const auto l = r.down(losses, rows);
    out.insert(out.end(), l.begin(), l.end());
    out.push_back(r.down(mean, 1)[0]);
    return out;
  };
  rig cpu("cpu"), gpu("cuda");
  expect_near_all(run(gpu), run(cpu), 1e-5, 1e-4);
}
