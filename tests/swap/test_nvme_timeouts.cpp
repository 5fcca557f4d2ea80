// Hung completions (Note [Hung completions] in swap/io_ring.cpp): an I/O whose completion never
// comes fails its move after nvme_options::io_timeout with an io_error naming the tensor, the
// swap directory and the cause; the request is cancelled, and its file blocks and buffer stay out
// of use until the late completion is reaped (or the tier goes). On io_uring and on the
// pread/pwrite threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "swap/nvme_speed.hpp"
#include "swap/nvme_tier.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;
using action = test::fault_plan::action;

namespace {

// Long enough that a busy CI disk (or a sanitizer on two cores) does not time out the I/O that is
// not held (400 ms once timed out a 256 KiB write of the thread queue while the whole suite ran
// on two cores), short enough to keep each test within a few seconds.
constexpr auto timeout = std::chrono::milliseconds(1500);

enum class queue_kind { uring, threads };

struct held_tier {
  test::temp_dir dir;
  std::shared_ptr<test::fault_plan> plan = std::make_shared<test::fault_plan>();
  std::unique_ptr<nvme_tier> tier;

  explicit held_tier(queue_kind b) {
    nvme_options o;
    o.directories = {dir.path()};
    o.reserve = 16_MiB;
    o.block_size = 256_KiB;
    o.queue_depth = 8;
    o.io_timeout = timeout;
    if (b == queue_kind::uring)
      o.make_queue = test::faulty(plan);
    else
      o.make_queue = test::faulty_threads(plan);
    tier = std::make_unique<nvme_tier>(o);
  }
  void hold(io_kind kind, std::uint64_t first) {
    plan->kind = kind;
    plan->reads = 0;
    plan->writes = 0;
    plan->first = first;
    plan->count = 1;
    plan->hits = 0;
    plan->what = action::hold;
  }
  // Hands the held completion back and waits (bounded) until the tier has reaped it.
  void release() {
    plan->disarm();
    plan->release_held = true;
    for (int i = 0; i < 400 && tier->stats().abandoned_ios != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
};

void expect_timeout_error(const io_error& e, const std::string& tensor, const std::string& dir) {
  const std::string m = e.what();
  EXPECT_EQ(e.error_number(), ETIMEDOUT) << m;
  EXPECT_NE(m.find("'" + tensor + "'"), std::string::npos) << m;
  EXPECT_NE(m.find(dir), std::string::npos) << m;
  EXPECT_NE(m.find("no completion after " + std::to_string(timeout.count()) + " ms"), std::string::npos) << m;
}

class NvmeTimeouts : public ::testing::TestWithParam<queue_kind> {};

}  // namespace

TEST_P(NvmeTimeouts, AWriteWithoutCompletionTimesOutAndItsBlocksStayHeldUntilTheLateCompletion) {
  held_tier h(GetParam());
  const auto before = h.tier->stats();
  const auto data = test::random_bytes(1_MiB, 1);  // 4 blocks
  h.hold(io_kind::write, 2);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    h.tier->write("victim", data.data(), data.size()).wait();
    FAIL() << "a write whose completion never came succeeded";
  } catch (const io_error& e) {
    expect_timeout_error(e, "victim", h.dir.path());
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, timeout);
  EXPECT_FALSE(h.tier->contains("victim"));
  auto st = h.tier->stats();
  EXPECT_EQ(st.timed_out_ios, 1u);
  EXPECT_EQ(st.abandoned_ios, 1u);
  EXPECT_GE(h.plan->cancels, 1u) << "the hung request was not cancelled";
  // The failed write's place in the file, where the kernel may still write, stays out of the
  // allocator until the late completion.
  EXPECT_EQ(st.free_bytes, before.free_bytes - 1_MiB);

  // The tier goes on: another tensor is written and read back whole (never onto the held block).
  const auto other = test::random_bytes(3_MiB, 2);
  h.tier->write("other", other.data(), other.size()).wait();
  // A snapshot taken while the late completion comes that counts no abandoned block counts its
  // file blocks free (one that still counts it may see them back already).
  std::atomic<bool> watching{true};
  std::atomic<int> snapshots{0};
  int torn = 0;
  std::thread watch([&] {
    while (watching.load()) {
      const auto s = h.tier->stats();
      ++snapshots;
      torn += s.abandoned_ios == 0 && s.free_bytes != before.free_bytes - 3_MiB;
    }
  });
  while (snapshots.load() == 0) std::this_thread::yield();  // watching before the completion comes
  h.release();
  watching = false;
  watch.join();
  EXPECT_GT(snapshots.load(), 0);
  EXPECT_EQ(torn, 0) << "a snapshot counted no abandoned block beside free bytes that still lacked its blocks";
  st = h.tier->stats();
  EXPECT_EQ(st.abandoned_ios, 0u);
  EXPECT_EQ(st.free_bytes, before.free_bytes - 3_MiB) << "the held block did not come back once reaped";
  std::vector<unsigned char> back(other.size());
  h.tier->read("other", back.data()).wait();
  EXPECT_EQ(back, other);
}

TEST_P(NvmeTimeouts, AReadWithoutCompletionTimesOutAndItsBufferIsReleasedOnlyAfterTheLateCompletion) {
  held_tier h(GetParam());
  const auto data = test::random_bytes(1_MiB + 100, 3);
  h.tier->write("kept", data.data(), data.size()).wait();
  h.hold(io_kind::read, 1);
  auto* buf = static_cast<unsigned char*>(std::aligned_alloc(4096, 2_MiB));
  ASSERT_NE(buf, nullptr);
  try {
    h.tier->read("kept", buf, 2_MiB).wait();
    FAIL() << "a read whose completion never came succeeded";
  } catch (const io_error& e) {
    expect_timeout_error(e, "kept", h.dir.path());
  }
  EXPECT_TRUE(h.tier->contains("kept")) << "a failed read keeps the tensor";
  std::atomic<bool> released{false};
  h.tier->after_settled(buf + 4096, [&] { released = true; });
  EXPECT_FALSE(released.load()) << "a buffer the kernel may still fill was handed back";
  bool other_released = false;
  const auto unrelated = test::random_bytes(10, 4);
  h.tier->after_settled(unrelated.data(), [&] { other_released = true; });
  EXPECT_TRUE(other_released) << "a buffer of no hung move waits for nothing";
  h.release();
  for (int i = 0; i < 400 && !released; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(released.load()) << "the buffer was never released after the late completion";
  std::vector<unsigned char> back(data.size());
  h.tier->read("kept", back.data()).wait();
  EXPECT_EQ(back, data) << "the tensor's bytes were lost";
  std::free(buf);
}

TEST_P(NvmeTimeouts, ATierDestroyedWithACompletionStillHeldEndsAndReleasesTheBuffer) {
  std::atomic<bool> released{false};
  auto* buf = static_cast<unsigned char*>(std::aligned_alloc(4096, 1_MiB));
  ASSERT_NE(buf, nullptr);
  std::string dir;
  {
    held_tier h(GetParam());
    dir = h.dir.path();
    const auto data = test::random_bytes(1_MiB, 5);
    h.tier->write("t", data.data(), data.size()).wait();
    h.hold(io_kind::read, 3);
    EXPECT_THROW(h.tier->read("t", buf, 1_MiB).wait(), io_error);
    h.tier->after_settled(buf, [&] { released = true; });
    EXPECT_FALSE(released.load());
    h.tier.reset();  // never released: the tier closes its queues, then lets the buffer go
    EXPECT_TRUE(released.load());
    EXPECT_TRUE(h.dir.empty()) << "the swap directory kept a file";
  }
  std::free(buf);
}

TEST_P(NvmeTimeouts, CompletionsInTimeAreNotTouched) {
  held_tier h(GetParam());
  const auto data = test::random_bytes(4_MiB + 7, 6);
  h.tier->write("ok", data.data(), data.size()).wait();
  std::vector<unsigned char> back(data.size());
  h.tier->read("ok", back.data()).wait();
  EXPECT_EQ(back, data);
  EXPECT_EQ(h.tier->stats().timed_out_ios, 0u);
  EXPECT_EQ(h.plan->cancels, 0u);
}

// The speed test's buffer comes from the pinned pool: a read of it that timed out may still
// land there, so it goes back to the pool only once the late completion is reaped, never while
// another block could be carved from it.
TEST_P(NvmeTimeouts, TheSpeedTestsBufferOfAReadThatTimedOutStaysOutOfThePoolUntilTheLateCompletion) {
  held_tier h(GetParam());
  cpu_device dev;
  pinned_host_pool pool(dev);
  h.hold(io_kind::read, 1);
  EXPECT_THROW((void)measure_speed(*h.tier, pool, 1_MiB), io_error);
  EXPECT_GT(pool.stats().allocated_bytes, 0u) << "the buffer the kernel may still fill went back to the pool";
  h.release();
  for (int i = 0; i < 400 && pool.stats().allocated_bytes != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(pool.stats().allocated_bytes, 0u) << "the buffer never went back after the late completion";
}

INSTANTIATE_TEST_SUITE_P(Queues, NvmeTimeouts, ::testing::Values(queue_kind::uring, queue_kind::threads),
                         [](const auto& info) { return info.param == queue_kind::uring ? "io_uring" : "threads"; });

TEST(NvmeTimeoutOption, ANegativeTimeoutIsAConfigErrorAndZeroMeansNone) {
  test::temp_dir dir;
  nvme_options o;
  o.directories = {dir.path()};
  o.reserve = 4_MiB;
  o.io_timeout = std::chrono::milliseconds(-1);
  EXPECT_THROW(nvme_tier{o}, config_error);
  o.io_timeout = std::chrono::milliseconds(0);
  nvme_tier t(o);
  EXPECT_EQ(nvme_options{}.io_timeout, std::chrono::milliseconds(30000));
}
