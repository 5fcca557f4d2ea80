// kernel_context: the workspace is the caller's, bound once and never grown mid-step (Note
// [Workspace]); cpu kernels run as kernels, not host functions; a launch reports only its own
// error (Note [Launch errors]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <string>
#include <vector>

#if SPILLWAY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "device/cpu_device.hpp"
#include "kernel_rig.hpp"
#include "kernels/kernels.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

/// Runs `f` and returns the message of the spillway::error it throws ("" when none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const spillway::error& e) {
    return e.what();
  }
  return "";
}

const conv2d_shape small_conv{2, 3, 8, 8, 4, {3, 1, 1}};  // batch, in, height, width, out, {kernel, stride, pad}

}  // namespace

TEST(Workspace, AKernelWithoutEnoughWorkspaceNamesTheSizeToBind) {
  auto dev = make_device("cpu");
  kernel_context ctx(*dev);
  owned_stream s(*dev);
  const int rows = 100, cols = 7;  // 400 bytes of row losses: a workspace of 512
  void* logits = dev->allocate(rows * cols * sizeof(float));
  void* targets = dev->allocate(rows * sizeof(std::int32_t));
  void* mean = dev->allocate(sizeof(float));
  dev->memset_async(logits, 0, rows * cols * sizeof(float), s);
  dev->memset_async(targets, 0, rows * sizeof(std::int32_t), s);
  const std::size_t need = softmax_cross_entropy_workspace_bytes(rows);
  const std::string msg = error_of([&] {
    softmax_cross_entropy(ctx, s, static_cast<float*>(logits), static_cast<std::int32_t*>(targets), nullptr,
                          static_cast<float*>(mean), nullptr, rows, cols, 1.0f);
  });
  EXPECT_NE(msg.find("softmax_cross_entropy needs a workspace of " + std::to_string(need) + " bytes"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("none is bound"), std::string::npos) << msg;

  // 256 bytes short: the error gives both sizes.
  void* ws = dev->allocate(need);
  ctx.bind_workspace(ws, need - 256);
  const std::string short_msg = error_of([&] {
    softmax_cross_entropy(ctx, s, static_cast<float*>(logits), static_cast<std::int32_t*>(targets), nullptr,
                          static_cast<float*>(mean), nullptr, rows, cols, 1.0f);
  });
  EXPECT_NE(short_msg.find(std::to_string(need - 256) + " bytes are bound"), std::string::npos) << short_msg;
  dev->synchronize();  // nothing failed on the stream: the errors came at the calls
  ctx.bind_workspace(nullptr, 0);
  for (auto [p, n] : {std::pair{logits, rows * cols * sizeof(float)}, std::pair{targets, rows * sizeof(std::int32_t)},
                      std::pair{mean, sizeof(float)}, std::pair{ws, need}})
    dev->deallocate(p, n);
}

TEST(Workspace, StepsWithABoundWorkspaceNeverAllocateOrFree) {
  auto dev = make_device("cpu");
  auto& cpu = static_cast<cpu_device&>(*dev);
  kernel_context ctx(*dev);
  owned_stream s(*dev);
  const conv2d_shape& sh = small_conv;
  const std::size_t x_n = static_cast<std::size_t>(sh.batch) * sh.in_channels * sh.height * sh.width;
  const std::size_t w_n = static_cast<std::size_t>(sh.out_channels) * sh.in_channels * sh.kernel.size * sh.kernel.size;
  const std::size_t y_n = static_cast<std::size_t>(sh.batch) * sh.out_channels * sh.out_height() * sh.out_width();
  const int rows = sh.batch, cols = static_cast<int>(y_n) / sh.batch;
  auto* x = static_cast<float*>(dev->allocate(x_n * sizeof(float)));
  auto* w = static_cast<float*>(dev->allocate(w_n * sizeof(float)));
  auto* dw = static_cast<float*>(dev->allocate(w_n * sizeof(float)));
  auto* y = static_cast<float*>(dev->allocate(y_n * sizeof(float)));
  auto* dx = static_cast<float*>(dev->allocate(x_n * sizeof(float)));
  auto* targets = static_cast<std::int32_t*>(dev->allocate(rows * sizeof(std::int32_t)));
  auto* mean = static_cast<float*>(dev->allocate(sizeof(float)));
  for (auto [p, n] : {std::pair<void*, std::size_t>{x, x_n * 4}, {w, w_n * 4}, {targets, rows * 4u}})
    dev->memset_async(p, 0, n, s);
  // Sized once, before the steps, from the kernels' own answers.
  const std::size_t bytes =
      std::max(conv2d_workspace_bytes(ctx, sh), softmax_cross_entropy_workspace_bytes(rows));
  void* ws = dev->allocate(bytes);
  ctx.bind_workspace(ws, bytes);
  dev->synchronize();
  const std::size_t used = dev->used_memory();
  const cpu_device_counters before = cpu.counters();
  for (int step = 0; step < 3; ++step) {
    conv2d_forward(ctx, s, sh, x, w, nullptr, y);
    softmax_cross_entropy(ctx, s, y, targets, nullptr, mean, y, rows, cols, 1.0f / static_cast<float>(rows));
    conv2d_backward(ctx, s, sh, x, w, y, dx, dw, nullptr, false);
    EXPECT_EQ(dev->used_memory(), used) << "step " << step;
  }
  dev->synchronize();
  const cpu_device_counters after = cpu.counters();
  EXPECT_EQ(after.synchronizing_frees, before.synchronizing_frees);
  EXPECT_EQ(after.kernels, before.kernels + 9);  // every cpu launch ran as a kernel...
  EXPECT_EQ(after.host_functions, before.host_functions);  // ...none as a host function
  // A larger batch mid-run is an error at the call, not a silent new allocation.
  const int more = static_cast<int>(bytes / sizeof(float)) + 1;
  const std::string msg = error_of([&] { softmax_cross_entropy(ctx, s, y, targets, nullptr, mean, nullptr, more, 1, 1.0f); });
  EXPECT_NE(msg.find("needs a workspace of " + std::to_string(softmax_cross_entropy_workspace_bytes(more))),
            std::string::npos)
      << msg;
  EXPECT_EQ(dev->used_memory(), used);
  ctx.bind_workspace(nullptr, 0);
  dev->deallocate(ws, bytes);
  for (auto [p, n] : {std::pair<void*, std::size_t>{x, x_n * 4}, {w, w_n * 4}, {dw, w_n * 4}, {y, y_n * 4},
                      {dx, x_n * 4}, {targets, rows * 4u}, {mean, 4}})
    dev->deallocate(p, n);
}

TEST(Workspace, ScopeBindsForItsOpAndRestoresTheBinding) {
  auto dev = make_device("cpu");
  kernel_context ctx(*dev);
  void* a = dev->allocate(4096);
  void* b = dev->allocate(1024);
  ctx.bind_workspace(a, 4096);
  {
    workspace_scope op(ctx, b, 1024);
    EXPECT_EQ(ctx.workspace_memory(), b);
    EXPECT_EQ(ctx.workspace(1024, "k"), b);
    EXPECT_THROW((void)ctx.workspace(1025, "k"), spillway::usage_error);
  }
  EXPECT_EQ(ctx.workspace_memory(), a);
  EXPECT_EQ(ctx.workspace_bytes(), 4096u);
  EXPECT_THROW(ctx.bind_workspace(static_cast<char*>(a) + 16, 256), spillway::usage_error);  // not 256-byte aligned
  EXPECT_THROW(ctx.bind_workspace(a, 0), spillway::usage_error);
  ctx.bind_workspace(nullptr, 0);
  dev->deallocate(a, 4096);
  dev->deallocate(b, 1024);
}

TEST(Workspace, GemmRunsWithAndWithoutABoundWorkspaceOnTheGpu) {
  SPILLWAY_NEEDS_CUDA();
  const int m = 64, n = 48, k = 80;
  const auto a = random_floats(m * k, 1), b = random_floats(k * n, 2);
  auto run = [&](rig& r) {
    float* c = r.alloc<float>(m * n);
    gemm(r.ctx(), r.s(), transpose::no, transpose::no, m, n, k, 1.0f, r.up(a), k, r.up(b), n, 0.0f, c, n);
    return r.down(c, m * n);
  };
  rig cpu("cpu"), bound("cuda"), unbound("cuda");
  unbound.ctx().bind_workspace(nullptr, 0);  // cuBLAS then works with no workspace at all
  const auto want = run(cpu);
  expect_near_all(run(bound), want, 1e-4, 1e-4, "bound");
  expect_near_all(run(unbound), want, 1e-4, 1e-4, "unbound");
}

#if SPILLWAY_HAVE_CUDA
TEST(LaunchCheck, AnEarlierToleratedErrorIsNotBlamedOnTheNextLaunch) {
  SPILLWAY_NEEDS_CUDA();
  rig r("cuda");
  const std::vector<float> xs = {1, 2, 3, 4};
  const float* x = r.up(xs);
  float* y = r.alloc<float>(4);
  // Nothing here may wait for the device while the stream is held below: the gate opens only
  // after the launch, on this thread. So the kernel runs once first (CUDA loads a kernel at its
  // first launch, and that load waits for the context's work), and the allocation that fails
  // comes before the hold (a failing cudaMalloc may wait for the device while it frees cached
  // memory to try again). On an H200 the check hung with the allocation behind the hold, and
  // before that with the kernel's first launch there.
  scale(r.ctx(), r.s(), x, 1.0f, y, 4);
  r.sync();
  // Code that asks and tolerates the answers, leaving them in the runtime's last-error slot: a
  // caught allocation failure, then a query of unfinished work.
  void* huge = nullptr;
  EXPECT_NE(cudaMalloc(&huge, std::size_t{1} << 60), cudaSuccess);
  cudaEvent_t ev = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  std::promise<void> gate = r.hold_stream();  // unfinished work until the gate opens; no ASSERT until then
  EXPECT_EQ(cudaEventRecord(ev, static_cast<cudaStream_t>(r.s().handle)), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  EXPECT_NO_THROW(scale(r.ctx(), r.s(), x, 2.0f, y, 4));
  gate.set_value();
  EXPECT_EQ(r.down(y, 4), (std::vector<float>{2, 4, 6, 8}));
  (void)cudaEventDestroy(ev);
}
#endif
