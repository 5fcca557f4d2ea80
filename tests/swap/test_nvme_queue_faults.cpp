// The I/O queue itself misbehaving, below the tier: a submission the kernel refuses (submit
// throws), reaping that throws, and fixed-buffer registration refused. Each ends in an error
// naming the tensor, or in a recovery the test observes; nothing stored before is lost.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/log.hpp"
#include "device/units.hpp"
#include "swap/nvme_tier.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

/// What the wrapped queue does wrong, switched from the test.
struct misbehaviour {
  std::atomic<int> submit_throws{0};  // the next N submissions throw
  std::atomic<int> submit_takes_half{0};  // the next N submissions of several ops take the first half only
  std::atomic<int> reap_throws{0};    // the next N reaps throw
  bool refuse_registration = false;
  std::atomic<int> reaps_thrown{0};
};

class misbehaving_queue final : public io_queue {
 public:
  misbehaving_queue(std::unique_ptr<io_queue> inner, std::shared_ptr<misbehaviour> m)
      : inner_(std::move(inner)), m_(std::move(m)) {}
  [[nodiscard]] unsigned depth() const noexcept override { return inner_->depth(); }
  int register_buffers(std::span<const iovec> b) override {
    return m_->refuse_registration ? -ENOMEM : inner_->register_buffers(b);
  }
  void unregister_buffers() noexcept override { inner_->unregister_buffers(); }
  int reserve_buffer_slots(unsigned slots) override {
    return m_->refuse_registration ? -ENOMEM : inner_->reserve_buffer_slots(slots);
  }
  int update_buffer(unsigned index, const iovec& buffer) override {
    return m_->refuse_registration ? -ENOMEM : inner_->update_buffer(index, buffer);
  }
  std::size_t submit(std::span<io_op* const> ops) override {
    if (m_->submit_throws.load() > 0) {
      m_->submit_throws.fetch_sub(1);
      throw io_error("io_uring_submit refused the batch", EBUSY);
    }
    if (m_->submit_takes_half.load() > 0 && ops.size() > 1) {
      m_->submit_takes_half.fetch_sub(1);
      return inner_->submit(ops.first(ops.size() / 2));
    }
    return inner_->submit(ops);
  }
  int cancel(io_op* op) override { return inner_->cancel(op); }
  std::size_t reap(std::span<io_completion> out, std::chrono::microseconds timeout) override {
    if (m_->reap_throws.load() > 0) {
      m_->reap_throws.fetch_sub(1);
      m_->reaps_thrown.fetch_add(1);
      throw std::runtime_error("io_uring_wait_cqe failed");
    }
    return inner_->reap(out, timeout);
  }

 private:
  std::unique_ptr<io_queue> inner_;
  std::shared_ptr<misbehaviour> m_;
};

struct tier_over {
  test::temp_dir dir;
  std::shared_ptr<misbehaviour> m = std::make_shared<misbehaviour>();
  std::unique_ptr<nvme_tier> tier;
  explicit tier_over(bool refuse_registration = false) {
    m->refuse_registration = refuse_registration;
    nvme_options o;
    o.directories = {dir.path()};
    o.reserve = 16_MiB;
    o.block_size = 256_KiB;
    o.queue_depth = 8;
    o.make_queue = [m = m](unsigned depth) -> std::unique_ptr<io_queue> {
      std::unique_ptr<io_queue> inner;
      try {
        inner = make_uring_queue(depth);
      } catch (const io_error&) {
        inner = make_thread_queue(depth);  // where io_uring is refused, as the tier does
      }
      return std::make_unique<misbehaving_queue>(std::move(inner), m);
    };
    tier = std::make_unique<nvme_tier>(o);
  }
};

void round_trip(nvme_tier& t, const std::string& name, std::uint64_t bytes, unsigned seed) {
  const auto data = test::random_bytes(bytes, seed);
  t.write(name, data.data(), data.size()).wait();
  std::vector<unsigned char> back(data.size());
  t.read(name, back.data()).wait();
  EXPECT_EQ(back, data) << name;
}

}  // namespace

TEST(NvmeQueueFaults, ASubmissionTheKernelRefusesFailsTheMoveNamingTheTensorAndTheCause) {
  tier_over s;
  const auto kept = test::random_bytes(1_MiB, 1);
  s.tier->write("kept", kept.data(), kept.size()).wait();
  s.m->submit_throws = 1;
  const auto data = test::random_bytes(1_MiB, 2);
  try {
    s.tier->write("w.new", data.data(), data.size()).wait();
    FAIL() << "a refused submission went unnoticed";
  } catch (const io_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'w.new'"), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(EBUSY)), std::string::npos) << "the submission's errno: " << what;
    EXPECT_NE(what.find(s.dir.path()), std::string::npos) << what;
  }
  std::vector<unsigned char> back(kept.size());
  s.tier->read("kept", back.data()).wait();
  EXPECT_EQ(back, kept) << "a tensor stored before the refusal";
  round_trip(*s.tier, "after", 1_MiB + 3, 3);  // the tier keeps working
}

// A queue that takes only part of a batch (the submission ring ran out of entries) starts that
// part, whose completions still come, and not the rest: the move fails as a refused submission
// does, nothing the queue holds is freed under it, and the tier keeps working.
TEST(NvmeQueueFaults, ASubmissionTakenInPartFailsTheMoveAndTheTierGoesOn) {
  tier_over s;
  s.m->submit_takes_half = 1;
  const auto data = test::random_bytes(2_MiB, 5);  // 8 blocks: one batch
  try {
    s.tier->write("half", data.data(), data.size()).wait();
    FAIL() << "a write half of whose blocks were never started succeeded";
  } catch (const io_error& e) {
    EXPECT_NE(std::string(e.what()).find("'half'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(EBUSY)), std::string::npos)
        << "the blocks not started fail at once, as refused (not as a timeout): " << e.what();
  }
  EXPECT_FALSE(s.tier->contains("half"));
  round_trip(*s.tier, "after", 2_MiB + 5, 6);
  s.tier.reset();  // every taken op came back: the tier ends without waiting for any
}

TEST(NvmeQueueFaults, AReapThatThrowsIsRetriedAndTheMoveCompletes) {
  tier_over s;
  s.m->reap_throws = 3;
  round_trip(*s.tier, "t", 2_MiB, 4);
  EXPECT_EQ(s.m->reaps_thrown.load(), 3);
}

TEST(NvmeQueueFaults, RefusedBufferRegistrationFallsBackToUnregisteredBuffers) {
  tier_over s(/*refuse_registration=*/true);
  round_trip(*s.tier, "a", 3_MiB + 17, 5);
  round_trip(*s.tier, "b", 256_KiB, 6);
  const auto st = s.tier->stats();
  EXPECT_GT(st.ops, 0u);
  EXPECT_EQ(st.fixed_buffer_ops, 0u) << "no op may use a buffer the kernel refused to register";
  EXPECT_EQ(st.region_pins, 0u);
}

// With a pinned pool the ring does try to register its regions; refused as the kernel refuses a
// process past its locked-memory limit, the tier moves the pool's buffers unregistered, and its
// warning says which limit stood in the way and how to raise it.
namespace {

// Lowers this process's locked-memory limit and collects the warnings logged, both until it goes
// (an assertion that fails midway leaves neither to the tests after it).
struct low_memlock_and_warnings {
  rlimit before{}, low{};
  std::mutex m;
  std::vector<std::string> warnings;
  log_sink previous;
  explicit low_memlock_and_warnings(rlim_t limit) {
    if (::getrlimit(RLIMIT_MEMLOCK, &before) != 0) throw std::runtime_error("getrlimit(RLIMIT_MEMLOCK) failed");
    low = before;  // lowering the soft limit is always allowed, and raising it back to where it was
    if (before.rlim_cur == RLIM_INFINITY || before.rlim_cur > limit) low.rlim_cur = limit;
    if (::setrlimit(RLIMIT_MEMLOCK, &low) != 0) throw std::runtime_error("setrlimit(RLIMIT_MEMLOCK) failed");
    previous = set_log_sink([this](log_level l, const std::string& msg) {
      std::lock_guard lock(m);
      if (l == log_level::warning) warnings.push_back(msg);
    });
  }
  ~low_memlock_and_warnings() {
    set_log_sink(previous);
    (void)::setrlimit(RLIMIT_MEMLOCK, &before);
  }
  low_memlock_and_warnings(const low_memlock_and_warnings&) = delete;
  low_memlock_and_warnings& operator=(const low_memlock_and_warnings&) = delete;
};

}  // namespace

TEST(NvmeQueueFaults, ARegistrationPastTheLockedMemoryLimitSaysHowToRaiseIt) {
  low_memlock_and_warnings env(1024 * 1024);
  std::uint64_t pinned = 0;  // the pool's regions, all the ring tried to register
  {
    cpu_device dev;
    pinned_host_pool pool(dev, {.capacity = 0, .region_size = 4_MiB, .alignment = 4096});
    auto mis = std::make_shared<misbehaviour>();
    mis->refuse_registration = true;
    test::temp_dir dir;
    nvme_options o;
    o.directories = {dir.path()};
    o.reserve = 8_MiB;
    o.make_queue = [mis](unsigned depth) -> std::unique_ptr<io_queue> {
      return std::make_unique<misbehaving_queue>(make_thread_queue(depth), mis);
    };
    nvme_tier tier(o, &pool);
    const auto data = test::random_bytes(3_MiB, 7);
    auto* buf = static_cast<unsigned char*>(pool.allocate(data.size()));
    std::memcpy(buf, data.data(), data.size());
    tier.write("t", buf, data.size(), data.size()).wait();
    std::memset(buf, 0, data.size());
    tier.read("t", buf, data.size()).wait();
    EXPECT_EQ(std::memcmp(buf, data.data(), data.size()), 0);
    const auto st = tier.stats();
    EXPECT_GT(st.ops, 0u);
    EXPECT_EQ(st.fixed_buffer_ops, 0u);
    for (const auto& r : pool.regions()) pinned += r.bytes;
    pool.deallocate(buf, data.size());
  }
  std::lock_guard lock(env.m);
  ASSERT_EQ(env.warnings.size(), 1u) << "one warning, when the ring first registers";
  const auto& w = env.warnings[0];
  EXPECT_NE(w.find("cannot register pinned buffers with io_uring (Cannot allocate memory)"), std::string::npos) << w;
  EXPECT_NE(w.find("the locked-memory limit (RLIMIT_MEMLOCK) is " + std::to_string(env.low.rlim_cur >> 10) +
                   " KiB, below the " + std::to_string(pinned >> 10) + " KiB of pinned buffers"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("ulimit -l"), std::string::npos) << w;
}
