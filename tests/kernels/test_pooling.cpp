// Max pooling (with padding, overlapping windows) and global average pooling against float64
// references, forward and backward; cuda against cpu.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "kernel_rig.hpp"
#include "kernels/pooling.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

struct pool_ref {
  std::vector<float> y;
  std::vector<float> dx;
};

pool_ref max_pool_ref(const pool2d_shape& sh, const std::vector<float>& x, const std::vector<float>& dy) {
  const int P = sh.out_height(), Q = sh.out_width();
  pool_ref out{std::vector<float>(static_cast<std::size_t>(sh.batch) * sh.channels * P * Q),
               std::vector<float>(x.size(), 0.0f)};
  for (int pl = 0; pl < sh.batch * sh.channels; ++pl)
    for (int p = 0; p < P; ++p)
      for (int q = 0; q < Q; ++q) {
        float best = -std::numeric_limits<float>::infinity();
        int at = -1;
        for (int i = 0; i < sh.window.size; ++i)
          for (int j = 0; j < sh.window.size; ++j) {
            const int yy = p * sh.window.stride - sh.window.pad + i, xx = q * sh.window.stride - sh.window.pad + j;
            if (yy < 0 || yy >= sh.height || xx < 0 || xx >= sh.width) continue;
            const int idx = (pl * sh.height + yy) * sh.width + xx;
            if (at < 0 || x[idx] > best) {
              best = x[idx];
              at = idx;
            }
          }
        const int o = (pl * P + p) * Q + q;
        out.y[o] = best;
        out.dx[at] += dy[o];
      }
  return out;
}

class MaxPoolShapes : public ::testing::TestWithParam<pool2d_shape> {};

}  // namespace

TEST_P(MaxPoolShapes, ForwardAndBackwardMatchReference) {
  const pool2d_shape sh = GetParam();
  const std::size_t nx = static_cast<std::size_t>(sh.batch) * sh.channels * sh.height * sh.width;
  const std::size_t ny = static_cast<std::size_t>(sh.batch) * sh.channels * sh.out_height() * sh.out_width();
  const auto x = random_floats(nx, 1);
  const auto dy = random_floats(ny, 2);
  const auto want = max_pool_ref(sh, x, dy);
  rig r;
  const float* dx_in = r.up(x);
  float* y = r.alloc<float>(ny);
  max_pool2d_forward(r.ctx(), r.s(), sh, dx_in, y);
  EXPECT_EQ(r.down(y, ny), want.y);
  float* dx = r.up(std::vector<float>(nx, 9.0f));
  max_pool2d_backward(r.ctx(), r.s(), sh, dx_in, y, r.up(dy), dx);
  expect_near_all(r.down(dx, nx), want.dx, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Windows, MaxPoolShapes,
                         ::testing::Values(pool2d_shape{2, 3, 8, 8, {2, 2, 0}},    // 2x2 stride 2
                                           pool2d_shape{2, 3, 9, 7, {3, 2, 1}}));  // ResNet stem: 3x3/2 pad 1

TEST(MaxPool2d, AnEmptyOrNegativePlaneIsRefusedBeforeAnyWork) {
  // Every window of a plane with no rows (or no columns) is all padding: there is no maximum to
  // take, and the launchers would read before x and write before dx. Refused at the call, on
  // every backend, naming the shape; the pointers are never read.
  rig r;
  float* d = r.alloc<float>(64);
  for (const pool2d_shape& sh : {pool2d_shape{1, 1, 0, 4, {2, 2, 1}}, pool2d_shape{1, 1, 4, 0, {2, 2, 1}},
                                 pool2d_shape{1, 1, -2, 4, {2, 2, 1}}, pool2d_shape{1, 1, 4, -3, {3, 1, 1}}}) {
    const std::string shape = std::to_string(sh.height) + ", " + std::to_string(sh.width);
    try {
      max_pool2d_forward(r.ctx(), r.s(), sh, d, d);
      r.sync();
      ADD_FAILURE() << "forward took a " << shape << " plane";
      continue;
    } catch (const spillway::usage_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("max_pool2d_forward"), std::string::npos) << what;
      EXPECT_NE(what.find(shape), std::string::npos) << what;
      EXPECT_NE(what.find("height and width must be at least 1"), std::string::npos) << what;
    }
    ASSERT_THROW(max_pool2d_backward(r.ctx(), r.s(), sh, d, d, d, d), spillway::usage_error) << shape;
  }
  // A window that does not move, or a padding that makes a window of padding alone: refused too.
  EXPECT_THROW(max_pool2d_forward(r.ctx(), r.s(), pool2d_shape{1, 1, 4, 4, {2, 0, 0}}, d, d), spillway::usage_error);
  EXPECT_THROW(max_pool2d_forward(r.ctx(), r.s(), pool2d_shape{1, 1, 4, 4, {2, 2, 2}}, d, d), spillway::usage_error);
  EXPECT_THROW(max_pool2d_forward(r.ctx(), r.s(), pool2d_shape{1, 0, 4, 4, {2, 2, 0}}, d, d), spillway::usage_error);
  r.sync();
}

TEST(GlobalAvgPool, ForwardAndBackward) {
  const int batch = 3, channels = 5, plane = 49;
  const auto x = random_floats(static_cast<std::size_t>(batch) * channels * plane, 3);
  const auto dy = random_floats(static_cast<std::size_t>(batch) * channels, 4);
  rig r;
  float* y = r.alloc<float>(batch * channels);
  global_avg_pool_forward(r.ctx(), r.s(), r.up(x), y, batch, channels, plane);
  const auto got = r.down(y, batch * channels);
  for (int pl = 0; pl < batch * channels; ++pl) {
    double s = 0;
    for (int i = 0; i < plane; ++i) s += x[pl * plane + i];
    EXPECT_NEAR(got[pl], s / plane, 1e-6);
  }
  float* dx = r.alloc<float>(x.size());
  global_avg_pool_backward(r.ctx(), r.s(), r.up(dy), dx, batch, channels, plane);
  const auto g = r.down(dx, x.size());
  for (int pl = 0; pl < batch * channels; ++pl)
    for (int i = 0; i < plane; ++i) EXPECT_FLOAT_EQ(g[pl * plane + i], dy[pl] / plane);
}

TEST(PoolingCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const pool2d_shape sh{4, 16, 32, 32, {3, 2, 1}};
  const std::size_t nx = static_cast<std::size_t>(sh.batch) * sh.channels * sh.height * sh.width;
  const std::size_t ny = static_cast<std::size_t>(sh.batch) * sh.channels * sh.out_height() * sh.out_width();
  const auto x = random_floats(nx, 5);
  const auto dy = random_floats(ny, 6);
  auto run = [&](rig& r) {
    const float* dx_in = r.up(x);
    float* y = r.alloc<float>(ny);
    max_pool2d_forward(r.ctx(), r.s(), sh, dx_in, y);
    float* dx = r.alloc<float>(nx);
    max_pool2d_backward(r.ctx(), r.s(), sh, dx_in, y, r.up(dy), dx);
    float* g = r.alloc<float>(sh.batch * sh.channels);
    global_avg_pool_forward(r.ctx(), r.s(), dx_in, g, sh.batch, sh.channels, sh.height * sh.width);
    float* gdx = r.alloc<float>(nx);
    global_avg_pool_backward(r.ctx(), r.s(), g, gdx, sh.batch, sh.channels, sh.height * sh.width);
    return std::vector<std::vector<float>>{r.down(y, ny), r.down(dx, nx), r.down(g, sh.batch * sh.channels),
                                           r.down(gdx, nx)};
  };
  rig cpu("cpu"), gpu("cuda");
  const auto want = run(cpu);
  const auto got = run(gpu);
  for (std::size_t i = 0; i < want.size(); ++i) expect_near_all(got[i], want[i], 1e-5, 1e-5, "output " + std::to_string(i));
}

// Past 2^28 threads (the most blocks_for gives a grid, times 256): the kernel must cover the rest
// with a grid-stride loop. The output starts as NaN bytes; every element must come out 0.
TEST(GlobalAvgPoolCuda, CoversMorePlanesThanTheGridHasThreads) {
  SPILLWAY_NEEDS_CUDA();
  const int batch = (1 << 20) + 4, channels = 256;  // 2^28 + 1024 planes of one pixel
  const std::size_t planes = static_cast<std::size_t>(batch) * channels;
  rig r("cuda");
  const float* x = r.alloc<float>(planes);
  float* y = r.alloc<float>(planes);
  r.dev().memset_async(y, 0xff, planes * sizeof(float), r.s());
  global_avg_pool_forward(r.ctx(), r.s(), x, y, batch, channels, 1);
  EXPECT_EQ(r.down(y + planes - 4096, 4096), std::vector<float>(4096, 0.0f));
}
