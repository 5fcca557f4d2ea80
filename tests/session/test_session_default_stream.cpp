// On CUDA, work a loop launches with no stream inside an op's scope (the legacy default stream: a
// synchronous cudaMemcpy of the loss, a kernel or memset given no stream) is ordered with the op:
// it runs after what the op's stream did before it, and what comes after the op (the next op, a
// swap-out) waits for it (Note [The default stream] in prefetch/executor.cpp). Each check holds the
// stream it waits on for 50 ms first, so work that is not ordered runs early and is seen, not
// raced past. Runs where a GPU answers; skips elsewhere (the cpu backend has no default stream:
// nothing runs outside its streams).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "offload/session_config.hpp"
#include "offload/swap_policy.hpp"

using namespace spillway;

namespace {

constexpr std::size_t n = std::size_t{1} << 20;

session_config cuda_config(const std::string& policy, double ratio) {
  session_config c;
  c.backend = "cuda";
  c.policy = policy;
  c.device_budget_ratio = ratio;
  // Without a ratio, a fixed budget: what is free would be nearly the whole GPU, which the test
  // programs the GPU check runs beside this one need too.
  if (ratio == 0) c.device_budget = std::uint64_t{256} << 20;
  return c;
}

void hold_50ms(void* /*unused*/) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

bool all_are(const std::vector<std::uint8_t>& v, std::uint8_t x) {
  for (auto b : v)
    if (b != x) return false;
  return true;
}

class SessionDefaultStream : public ::testing::TestWithParam<std::pair<const char*, double>> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU answers (the cpu backend has no default stream)";
  }
};

// A loop's loss copied to the host with cudaMemcpy inside the op that makes it, and a value set on
// the default stream inside one op and copied by the next op on its stream, every step: each sees
// the value of its own step.
TEST_P(SessionDefaultStream, WorkWithNoStreamInsideAnOpIsOrderedWithIt) {
  const auto [policy, ratio] = GetParam();
  Session s(cuda_config(policy, ratio));
  auto w = s.add_persistent("w", n, tensor_kind::parameter);
  for (int step = 1; step <= 5; ++step) {
    const auto v = static_cast<std::uint8_t>(step);
    s.begin_iteration();
    auto loss = s.add_transient("loss", n, tensor_kind::metric);
    std::vector<std::uint8_t> host(n);
    {
      auto op = s.op("loss.forward", {w}, {loss});
      op.device().launch_host(op.stream(), [] { hold_50ms(nullptr); });
      op.device().memset_async(op.ptr(loss), v, n, op.stream());
      ASSERT_EQ(cudaMemcpy(host.data(), op.ptr(loss), n, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    EXPECT_TRUE(all_are(host, v)) << "step " << step << ": cudaMemcpy ran before the op's stream";
    auto y = s.add_transient("y", n);
    {
      auto op = s.op("y.forward", {loss}, {y});
      ASSERT_EQ(cudaLaunchHostFunc(nullptr, hold_50ms, nullptr), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(op.ptr(y), v + 100, n, nullptr), cudaSuccess);
    }
    s.release(loss);
    auto z = s.add_transient("z", n, tensor_kind::metric);
    {
      auto op = s.op("z.forward", {y}, {z});
      op.device().copy_async(op.ptr(z), op.ptr(y), n, copy_kind::device_to_device, op.stream());
    }
    s.release(y);
    s.read(z, host.data(), n);
    EXPECT_TRUE(all_are(host, static_cast<std::uint8_t>(v + 100)))
        << "step " << step << ": the next op ran before the default stream's memset";
    s.release(z);
    (void)s.end_iteration();
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, SessionDefaultStream,
                         ::testing::Values(std::pair<const char*, double>{"none", 0.0},
                                           std::pair<const char*, double>{"lms", 0.75}));

}  // namespace
