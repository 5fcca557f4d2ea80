// The rules that make a backend at least as strict as CUDA, one test each. Every check runs on
// the strict cpu backend (where it must hold), on the cpu backend with that one rule switched
// off (where it must not: the check can fail), and on the cuda backend where a GPU answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "device/cpu_device.hpp"
#include "device/device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "../session/watchdog.hpp"

using namespace spillway;
using namespace spillway::literals;
using clk = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

device_options small() {
  device_options o;
  o.cpu_device_memory = 64_MiB;
  return o;
}

std::unique_ptr<Device> strict_cpu() { return make_device("cpu", small()); }

template <class Off>
std::unique_ptr<Device> cpu_without(Off switch_off) {
  auto o = small();
  switch_off(o.strict);
  return make_device("cpu", o);
}

std::unique_ptr<Device> gpu_or_null() { return cuda_available() ? make_device("cuda", small()) : nullptr; }

/// `holds` (a check of one rule on a Device) is true on the strict cpu backend and on a GPU, and
/// false on a cpu backend with that rule switched off: the check tells the rule from its absence.
template <class Holds, class Off>
void expect_rule(Holds holds, Off switch_off) {
  EXPECT_TRUE(holds(*strict_cpu())) << "strict cpu backend";
  EXPECT_FALSE(holds(*cpu_without(switch_off))) << "cpu backend with the rule off";
  if (auto gpu = gpu_or_null()) {
    EXPECT_TRUE(holds(*gpu)) << "cuda backend";
  }
}

double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }

// ---- the checks: each returns true when the backend keeps the rule -----------------------------

// Host functions of different streams never run at the same time (one callback thread).
bool host_functions_share_one_thread(Device& dev) {
  constexpr int streams = 4;
  std::vector<owned_stream> ss;
  for (int i = 0; i < streams; ++i) ss.emplace_back(dev);
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::mutex m;
  std::set<std::thread::id> threads;
  for (int round = 0; round < 3; ++round) {
    for (auto& s : ss) {
      dev.launch_host(s, [&] {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(milliseconds(5));
        {
          std::lock_guard lock(m);
          threads.insert(std::this_thread::get_id());
        }
        --running;
      });
    }
  }
  dev.synchronize();
  return most.load() == 1 && threads.size() == 1;
}

// A host function that calls the Device fails, and the device reports it.
bool device_calls_from_host_functions_fail(Device& dev) {
  owned_stream s(dev);
  void* got = nullptr;
  dev.launch_host(s, [&] { got = dev.allocate(4096); });
  try {
    dev.synchronize_stream(s);
  } catch (const usage_error& e) {  // a misuse of the Device, by the program's host function
    return got == nullptr && std::string(e.what()).find("must not call the Device") != std::string::npos;
  }
  if (got != nullptr) dev.deallocate(got, 4096);
  return false;
}

// A copy to memory that is not pinned returns only when the stream's earlier work and the copy
// are done (CUDA documents this for device to pageable host copies).
bool pageable_copies_are_synchronous(Device& dev) {
  owned_stream s(dev);
  std::vector<unsigned char> pageable(1_MiB, 7);
  void* d = dev.allocate(1_MiB);
  dev.memset_async(d, 3, 1_MiB, s);
  dev.launch_kernel(s, [] { std::this_thread::sleep_for(milliseconds(150)); });
  const auto t0 = clk::now();
  dev.copy_async(pageable.data(), d, pageable.size(), copy_kind::device_to_host, s);
  const double took = ms_since(t0);
  const bool landed = pageable.front() == 3 && pageable.back() == 3;  // read before any synchronize
  dev.synchronize_stream(s);
  dev.deallocate(d, 1_MiB);
  return took >= 140 && landed;
}

// A copy from memory that is not pinned has taken its bytes when it returns: the caller may
// overwrite them at once. CUDA stages them; it may return before the stream's earlier work is
// done (so a GPU is not held to the wait that the cpu backend adds: the stricter of the two).
bool pageable_sources_are_taken_at_the_call(Device& dev) {
  owned_stream s(dev);
  std::vector<unsigned char> pageable(1_MiB, 7);
  void* d = dev.allocate(1_MiB);
  dev.launch_kernel(s, [] { std::this_thread::sleep_for(milliseconds(150)); });
  dev.copy_async(d, pageable.data(), pageable.size(), copy_kind::host_to_device, s);
  std::fill(pageable.begin(), pageable.end(), 9);  // after the call, perhaps before the copy ran
  std::vector<unsigned char> back(1_MiB, 0);
  dev.copy_async(back.data(), d, back.size(), copy_kind::device_to_host, s);
  dev.synchronize_stream(s);
  dev.deallocate(d, 1_MiB);
  return std::all_of(back.begin(), back.end(), [](unsigned char b) { return b == 7; });
}

// Bytes that the stream's earlier work writes into a pageable source are not what the copy
// sends: CUDA stages the source as the call runs, perhaps before that work. A loop counting on
// them must fail on the cpu backend too.
bool pageable_sources_are_not_read_after_earlier_work(Device& dev) {
  owned_stream s(dev);
  std::vector<unsigned char> pageable(1_MiB, 7);
  void* d = dev.allocate(1_MiB);
  dev.launch_kernel(s, [] { std::this_thread::sleep_for(milliseconds(100)); });
  dev.launch_host(s, [&] { std::fill(pageable.begin(), pageable.end(), 9); });
  dev.copy_async(d, pageable.data(), pageable.size(), copy_kind::host_to_device, s);
  std::vector<unsigned char> back(1_MiB, 0);
  dev.copy_async(back.data(), d, back.size(), copy_kind::device_to_host, s);
  dev.synchronize_stream(s);
  dev.deallocate(d, 1_MiB);
  return std::all_of(back.begin(), back.end(), [](unsigned char b) { return b == 7; });
}

// A copy whose pointers do not match its kind, or a memset of pageable host memory, is refused
// at the call (Note [Copy kinds] in cpu_device.cpp; cudaMemcpy leaves it undefined).
bool mismatched_copy_kinds_are_refused(Device& dev) {
  owned_stream s(dev);
  std::vector<unsigned char> host(4096, 1);
  auto* d = static_cast<unsigned char*>(dev.allocate(4096));
  int refused = 0;
  auto refuses = [&](auto call) {
    try {
      call();
    } catch (const usage_error&) {
      ++refused;
    }
    dev.synchronize_stream(s);  // with the rule off a copy runs: the next call's buffers are free again
  };
  refuses([&] { dev.copy_async(host.data(), d, 4096, copy_kind::host_to_device, s); });    // reversed
  refuses([&] { dev.copy_async(d, host.data(), 4096, copy_kind::device_to_host, s); });    // reversed
  refuses([&] { dev.copy_async(host.data(), d, 4096, copy_kind::device_to_device, s); });  // host as device
  refuses([&] { dev.copy_async(d, host.data(), 4096, copy_kind::host_to_host, s); });      // device as host
  refuses([&] { dev.memset_async(host.data(), 0, 4096, s); });
  dev.synchronize_stream(s);
  dev.deallocate(d, 4096);
  return refused == 5;
}

bool pinned_copies_are_asynchronous(Device& dev) {
  owned_stream s(dev);
  void* h = dev.allocate_pinned(1_MiB);
  void* d = dev.allocate(1_MiB);
  dev.launch_kernel(s, [] { std::this_thread::sleep_for(milliseconds(150)); });
  const auto t0 = clk::now();
  dev.copy_async(d, h, 1_MiB, copy_kind::host_to_device, s);
  const double took = ms_since(t0);
  dev.synchronize_stream(s);
  dev.deallocate(d, 1_MiB);
  dev.deallocate_pinned(h, 1_MiB);
  return took < 100;
}

// Freeing device memory waits for the device's work, as cudaFree does.
bool frees_synchronize(Device& dev) {
  owned_stream s(dev);
  void* d = dev.allocate(4096);
  dev.launch_kernel(s, [] { std::this_thread::sleep_for(milliseconds(150)); });
  const auto t0 = clk::now();
  dev.deallocate(d, 4096);
  const double took = ms_since(t0);
  dev.synchronize();
  return took >= 140;
}

// After stream work fails, every later synchronize of any stream reports it.
bool errors_are_sticky(Device& dev) {
  owned_stream a(dev), b(dev);
  dev.launch_host(a, [] { throw io_error("injected failure", 5); });
  bool first = false;
  try {
    dev.synchronize_stream(a);
  } catch (const io_error&) {
    first = true;
  }
  int again = 0;
  for (int i = 0; i < 2; ++i) {
    try {
      dev.synchronize_stream(i == 0 ? a : b);
    } catch (const io_error&) {
      ++again;
    }
  }
  bool whole = false;
  try {
    dev.synchronize();
  } catch (const io_error&) {
    whole = true;
  }
  return first && again == 2 && whole;
}

}  // namespace

// ---- one test per rule ---------------------------------------------------------------------

TEST(StrictRules, HostFunctionsShareOneCallbackThread) {
  EXPECT_TRUE(host_functions_share_one_thread(*strict_cpu()));
  EXPECT_FALSE(host_functions_share_one_thread(*cpu_without([](auto& r) { r.one_callback_thread = false; })));
}

TEST(StrictRules, HostFunctionsThatCallTheDeviceFail) {
  expect_rule(device_calls_from_host_functions_fail, [](auto& r) { r.no_device_calls_in_stream_work = false; });
}

TEST(StrictRules, CpuKernelsThatCallTheDeviceFail) {
  auto dev = strict_cpu();
  owned_stream s(*dev);
  dev->launch_kernel(s, [&] { dev->record_event(event{}, s); });
  EXPECT_THROW(dev->synchronize_stream(s), usage_error);
}

TEST(StrictRules, PageableCopiesAreSynchronous) {
  auto dev = strict_cpu();
  const auto before = static_cast<cpu_device&>(*dev).counters().synchronous_copies;
  EXPECT_TRUE(pageable_copies_are_synchronous(*dev));
  EXPECT_EQ(static_cast<cpu_device&>(*dev).counters().synchronous_copies, before + 1);
  EXPECT_TRUE(pinned_copies_are_asynchronous(*dev));
  EXPECT_EQ(static_cast<cpu_device&>(*dev).counters().synchronous_copies, before + 1) << "a pinned copy is not counted";
  EXPECT_FALSE(pageable_copies_are_synchronous(*cpu_without([](auto& r) { r.pageable_copies_synchronous = false; })));
  if (auto gpu = gpu_or_null()) {
    EXPECT_TRUE(pageable_copies_are_synchronous(*gpu));
    EXPECT_TRUE(pinned_copies_are_asynchronous(*gpu));
  }
}

TEST(StrictRules, PageableSourcesAreTakenAtTheCall) {
  expect_rule(pageable_sources_are_taken_at_the_call, [](auto& r) { r.pageable_copies_synchronous = false; });
}

TEST(StrictRules, PageableSourcesAreNotReadAfterEarlierWork) {
  EXPECT_TRUE(pageable_sources_are_not_read_after_earlier_work(*strict_cpu()));
  EXPECT_FALSE(pageable_sources_are_not_read_after_earlier_work(
      *cpu_without([](auto& r) { r.pageable_copies_synchronous = false; })));
  // On a GPU a source this small is staged at the call; a larger one may be read in pieces as the
  // copy runs, so either value may come: no check there.
}

TEST(StrictRules, MismatchedCopyKindsAreRefusedAtTheCall) {
  EXPECT_TRUE(mismatched_copy_kinds_are_refused(*strict_cpu()));
  EXPECT_FALSE(mismatched_copy_kinds_are_refused(*cpu_without([](auto& r) { r.copy_kinds_checked = false; })));
  // Undefined on a GPU: not run there.
}

TEST(StrictRules, ACopyPastTheEndOfADeviceBlockIsRefused) {
  auto dev = strict_cpu();
  owned_stream s(*dev);
  std::vector<unsigned char> host(4096, 1);
  auto* d = static_cast<unsigned char*>(dev->allocate(4096));
  try {
    dev->copy_async(d + 2048, host.data(), 4096, copy_kind::host_to_device, s);
    ADD_FAILURE() << "a copy past the block's end was taken";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("not inside one block"), std::string::npos) << e.what();
  }
  dev->synchronize_stream(s);
  dev->deallocate(d, 4096);
}

TEST(StrictRules, CopiesThatMatchTheirKindsRunInsideAndAtTheEdgesOfBlocks) {
  auto dev = strict_cpu();
  owned_stream s(*dev);
  auto* d = static_cast<unsigned char*>(dev->allocate(8192));
  auto* p = static_cast<unsigned char*>(dev->allocate_pinned(8192));
  std::vector<unsigned char> host(8192, 5);
  dev->copy_async(d + 4096, host.data(), 4096, copy_kind::host_to_device, s);  // ends at the block's end
  std::fill(host.begin(), host.end(), 0);  // the copy has its bytes (a pageable source)
  dev->copy_async(d, d + 4096, 4096, copy_kind::device_to_device, s);
  dev->copy_async(p, d, 8192, copy_kind::device_to_host, s);
  dev->copy_async(host.data(), p, 8192, copy_kind::host_to_host, s);
  dev->memset_async(p, 1, 16, s);
  dev->synchronize_stream(s);
  EXPECT_EQ(host[0], 5);
  EXPECT_EQ(host[8191], 5);
  EXPECT_EQ(p[0], 1);
  dev->deallocate(d, 8192);
  dev->deallocate_pinned(p, 8192);
}

TEST(StrictRules, PinnedRangesCountAsPinnedInside) {
  auto dev = strict_cpu();
  auto& cpu = static_cast<cpu_device&>(*dev);
  owned_stream s(*dev);
  auto* h = static_cast<unsigned char*>(dev->allocate_pinned(2_MiB));
  void* d = dev->allocate(1_MiB);
  const auto before = cpu.counters().synchronous_copies;
  dev->copy_async(d, h + 1_MiB, 1_MiB, copy_kind::host_to_device, s);  // inside the pinned block
  dev->copy_async(h + 4096, d, 1_MiB, copy_kind::device_to_host, s);
  EXPECT_EQ(cpu.counters().synchronous_copies, before);
  std::vector<unsigned char> pageable(1_MiB);
  dev->copy_async(pageable.data(), d, 1_MiB, copy_kind::device_to_host, s);  // to pageable memory
  EXPECT_EQ(cpu.counters().synchronous_copies, before + 1);
  dev->synchronize();
  dev->deallocate(d, 1_MiB);
  dev->deallocate_pinned(h, 2_MiB);
}

// Pinned counts only where the whole range is: a copy that runs past a pinned block's end, or a
// host-to-host copy from pageable memory, is a pageable copy and waits.
TEST(StrictRules, RangesPartlyPinnedAndPageableHostSourcesCountAsPageable) {
  auto dev = strict_cpu();
  auto& cpu = static_cast<cpu_device&>(*dev);
  owned_stream s(*dev);
  // 100 bytes short of 2 MiB: the mapping takes whole pages, so its last 100 bytes are mapped
  // but not pinned.
  auto* h = static_cast<unsigned char*>(dev->allocate_pinned(2_MiB - 100));
  void* d = dev->allocate(1_MiB);
  auto before = cpu.counters().synchronous_copies;
  dev->copy_async(d, h + 1_MiB, 1_MiB, copy_kind::host_to_device, s);  // its last 100 bytes are not pinned
  EXPECT_EQ(cpu.counters().synchronous_copies, before + 1);
  dev->copy_async(d, h + 1_MiB - 4096, 1_MiB, copy_kind::host_to_device, s);  // wholly inside
  EXPECT_EQ(cpu.counters().synchronous_copies, before + 1);
  std::vector<unsigned char> pageable(4096, 5);
  before = cpu.counters().synchronous_copies;
  dev->copy_async(h, pageable.data(), pageable.size(), copy_kind::host_to_host, s);
  EXPECT_EQ(cpu.counters().synchronous_copies, before + 1) << "a pageable source of a host-to-host copy";
  EXPECT_EQ(h[4095], 5) << "a pageable copy is done when it returns";
  dev->synchronize();
  dev->deallocate(d, 1_MiB);
  dev->deallocate_pinned(h, 2_MiB - 100);
}

TEST(StrictRules, NullPointersInCopiesAndMemsetsAreRefused) {
  auto dev = strict_cpu();
  owned_stream s(*dev);
  void* d = dev->allocate(4096);
  std::vector<unsigned char> host(4096);
  EXPECT_THROW(dev->copy_async(d, nullptr, 4096, copy_kind::host_to_device, s), usage_error);
  EXPECT_THROW(dev->copy_async(nullptr, d, 4096, copy_kind::device_to_host, s), usage_error);
  EXPECT_THROW(dev->memset_async(nullptr, 0, 4096, s), usage_error);
  dev->copy_async(host.data(), d, 4096, copy_kind::device_to_host, s);  // the stream still works
  dev->synchronize_stream(s);
  dev->deallocate(d, 4096);
}

// A record that could not be queued (no stream) leaves the event as it was: nothing waits for
// a mark that will never run.
TEST(StrictRules, ARecordThatFailsLeavesTheEventReached) {
  auto dev = strict_cpu();
  owned_event e(*dev);
  EXPECT_THROW(dev->record_event(e, stream{}), usage_error);
  spillway::testing::watchdog dog("ARecordThatFailsLeavesTheEventReached", std::chrono::seconds(30));
  EXPECT_TRUE(dev->query_event(e));
  dev->synchronize_event(e);
}

// Freeing device memory is a device call: from a kernel it is refused like any other.
TEST(StrictRules, AKernelThatFreesDeviceMemoryFails) {
  auto dev = strict_cpu();
  owned_stream s(*dev);
  void* d = dev->allocate(4096);
  dev->launch_kernel(s, [&] { dev->deallocate(d, 4096); });
  EXPECT_THROW(dev->synchronize_stream(s), usage_error);
}

// So is freeing it from the destructor of something the work captured: on CUDA the captures of
// a host function die inside the callback, where no runtime call is allowed, so here they die
// inside the stream work too, for kernels and host functions alike.
TEST(StrictRules, WorkWhoseCapturesFreeDeviceMemoryFails) {
  struct frees_on_death {
    frees_on_death(Device* device, void* block) : dev(device), d(block) {}
    frees_on_death(const frees_on_death&) = delete;
    frees_on_death& operator=(const frees_on_death&) = delete;
    Device* dev;
    void* d;
    ~frees_on_death() {
      if (d != nullptr) dev->deallocate(d, 4096);
    }
  };
  for (bool host_function : {false, true}) {
    auto dev = strict_cpu();
    owned_stream s(*dev);
    auto owner = std::make_shared<frees_on_death>(dev.get(), dev->allocate(4096));
    std::atomic<bool> go{false};
    dev->launch_kernel(s, [&go] {
      while (!go) std::this_thread::yield();  // holds the stream until the work's capture is the last owner
    });
    auto work = [owner] { (void)owner; };
    if (host_function)
      dev->launch_host(s, std::move(work));
    else
      dev->launch_kernel(s, std::move(work));
    owner.reset();
    go = true;
    // Freed outside the work, the free would wait for the very stream it runs on: a hang.
    spillway::testing::watchdog dog("WorkWhoseCapturesFreeDeviceMemoryFails", std::chrono::seconds(30));
    EXPECT_THROW(dev->synchronize_stream(s), usage_error) << (host_function ? "host function" : "kernel");
  }
}

// The CUDA backend unmaps the size deallocate_pinned is given: another size than the block's
// fails here too, with the size that is right.
TEST(StrictRules, APinnedFreeOfAnotherSizeFails) {
  auto dev = strict_cpu();
  owned_stream s(*dev);
  void* p = dev->allocate_pinned(8192);
  dev->deallocate_pinned(p, 100);
  try {
    dev->synchronize_stream(s);
    ADD_FAILURE() << "a pinned free of the wrong size went unnoticed";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("block of 8192"), std::string::npos) << e.what();
  }
}

TEST(StrictRules, FreesSynchronizeTheDevice) {
  auto dev = strict_cpu();
  const auto before = static_cast<cpu_device&>(*dev).counters().synchronizing_frees;
  EXPECT_TRUE(frees_synchronize(*dev));
  EXPECT_EQ(static_cast<cpu_device&>(*dev).counters().synchronizing_frees, before + 1);
  EXPECT_FALSE(frees_synchronize(*cpu_without([](auto& r) { r.free_synchronizes = false; })));
  if (auto gpu = gpu_or_null()) {
    EXPECT_TRUE(frees_synchronize(*gpu));
  }
}

TEST(StrictRules, FailuresAreSticky) {
  expect_rule(errors_are_sticky, [](auto& r) { r.sticky_errors = false; });
}

TEST(StrictRules, WorkAfterAStickyFailureIsRefused) {
  auto dev = strict_cpu();
  owned_stream s(*dev);
  int ran = 0;
  std::atomic<bool> go{false};
  dev->launch_kernel(s, [&] {
    while (!go) std::this_thread::yield();  // holds the stream until both kernels are queued
  });
  dev->launch_kernel(s, [] { throw io_error("injected failure", 5); });
  dev->launch_kernel(s, [&] { ran = 1; });  // already queued: skipped, as on a failed context
  go = true;
  EXPECT_THROW(dev->synchronize_stream(s), io_error);
  EXPECT_EQ(ran, 0);
  EXPECT_THROW(dev->launch_kernel(s, [] {}), io_error);
  EXPECT_THROW((void)dev->query_event(event{}), io_error);
}

// Event marks queued behind a failure still run, so waiting on them reports the failure instead
// of hanging, on the host and on another stream.
TEST(StrictRules, EventsRecordedBehindAFailureAreStillReached) {
  auto dev = strict_cpu();
  owned_stream s(*dev), other(*dev);
  owned_event e(*dev);
  std::atomic<bool> go{false};
  dev->launch_kernel(s, [&] {
    while (!go) std::this_thread::yield();  // holds the stream until the mark is queued
  });
  dev->launch_kernel(s, [] { throw io_error("injected failure", 5); });
  dev->record_event(e, s);
  dev->stream_wait_event(other, e);
  spillway::testing::watchdog dog("EventsRecordedBehindAFailureAreStillReached", std::chrono::seconds(30));
  go = true;
  EXPECT_THROW(dev->synchronize_event(e), io_error);
  EXPECT_THROW(dev->synchronize_stream(other), io_error);
  EXPECT_THROW(dev->synchronize_stream(s), io_error);
}

// The hang CUDA would give (a host function waiting for one queued behind it on the one
// callback thread) is an error naming both streams on the strict backend.
TEST(StrictRules, AHostFunctionWaitingForAnotherStreamIsReportedNotHung) {
  auto run = [](device_options::strict_rules rules, bool& reported, std::string& message) {
    auto o = small();
    o.strict = rules;
    auto dev = make_device("cpu", o);
    owned_stream a(*dev, stream_priority::high), b(*dev, stream_priority::low);
    auto released = std::make_shared<std::promise<void>>();
    auto done = released->get_future().share();
    std::atomic<bool> a_started{false};
    dev->launch_host(a, [done, &a_started] {
      a_started = true;
      done.wait();  // waits for b's host function: the bug
    });
    while (!a_started) std::this_thread::yield();
    dev->launch_host(b, [released] { released->set_value(); });
    auto sync = std::async(std::launch::async, [&] {
      try {
        dev->synchronize();
      } catch (const usage_error& e) {
        message = e.what();
        return true;
      }
      return false;
    });
    reported = sync.wait_for(std::chrono::seconds(3)) == std::future_status::ready && sync.get();
    if (!reported) {
      released->set_value();  // end the hang by hand so the test can finish
      sync.wait();
    } else {
      try {
        released->set_value();  // the blocked host function may now end
      } catch (const std::future_error&) {
      }
    }
  };
  device_options::strict_rules strict;
  strict.host_function_limit = milliseconds(300);
  bool reported = false;
  std::string message;
  run(strict, reported, message);
  EXPECT_TRUE(reported);
  EXPECT_NE(message.find("stream 1 (high priority)"), std::string::npos) << message;
  EXPECT_NE(message.find("stream 2 (low priority)"), std::string::npos) << message;

  device_options::strict_rules lax = strict;
  lax.host_function_limit = milliseconds(0);  // wait forever, as CUDA does
  bool lax_reported = true;
  run(lax, lax_reported, message);
  EXPECT_FALSE(lax_reported) << "without the limit the same program hangs";
}

TEST(StrictRules, TheSeedChoosesTheOrderOfReadyHostFunctions) {
  auto order_for = [](std::uint64_t seed) {
    auto o = small();
    o.strict.callback_seed = seed;
    auto dev = make_device("cpu", o);
    std::vector<owned_stream> ss;
    for (int i = 0; i < 7; ++i) ss.emplace_back(*dev);
    std::atomic<bool> go{false};
    std::atomic<bool> holding{false};
    std::vector<int> order;
    dev->launch_host(ss[0], [&] {
      holding = true;
      while (!go) std::this_thread::yield();  // holds the callback thread while the others queue
    });
    while (!holding) std::this_thread::yield();
    for (int i = 1; i < 7; ++i) dev->launch_host(ss[i], [&order, i] { order.push_back(i); });
    std::this_thread::sleep_for(milliseconds(50));  // every stream has handed its host function over
    go = true;
    dev->synchronize();
    return order;
  };
  const auto a = order_for(1);
  EXPECT_EQ(a.size(), 6u);
  EXPECT_EQ(order_for(1), a) << "the same seed gives the same order";
  bool differs = false;
  for (std::uint64_t seed = 2; seed < 8 && !differs; ++seed) differs = order_for(seed) != a;
  EXPECT_TRUE(differs) << "other seeds choose other orders";
}

TEST(StrictRules, TimingEventsMeasureDeviceTimeWithoutHostFunctions) {
  auto dev = strict_cpu();
  auto& cpu = static_cast<cpu_device&>(*dev);
  owned_stream s(*dev);
  owned_event start(*dev, true), end(*dev, true);
  const auto host_functions = cpu.counters().host_functions;
  dev->record_event(start, s);
  dev->launch_kernel(s, [] { std::this_thread::sleep_for(milliseconds(30)); });
  dev->record_event(end, s);
  dev->synchronize_stream(s);
  const double ms = dev->elapsed_ms(start, end);
  EXPECT_GE(ms, 29.0);
  EXPECT_LT(ms, 2000.0);
  EXPECT_EQ(cpu.counters().host_functions, host_functions);
  owned_event plain(*dev);
  dev->record_event(plain, s);
  dev->synchronize_stream(s);
  EXPECT_THROW((void)dev->elapsed_ms(start, plain), usage_error) << "a plain event has no time";
}

TEST(StrictRules, ConcurrentAllocationsAndFreesKeepTheBooks) {
  for (const char* kind : {"cpu", "cuda"}) {
    if (std::string(kind) == "cuda" && !cuda_available()) continue;
    auto dev = make_device(kind, small());
    const auto base = dev->used_memory();
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i) {
          const std::size_t n = 4096 * static_cast<std::size_t>(1 + (i + t) % 7);
          void* p = dev->allocate(n);
          if (p == nullptr) ++mismatches;
          dev->deallocate(p, n);
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0) << kind;
    EXPECT_EQ(dev->used_memory(), base) << kind;
  }
}

TEST(StrictRules, NoGpuIsNoProblemWhereNoDriverIsInstalled) {
  if (!cuda_available()) {
    // Either there is no driver (nothing to report) or the probe explains why it has no GPU.
    const std::string problem = cuda_problem();
    if (problem.empty()) {
      EXPECT_EQ(make_device("auto")->properties().backend, backend::cpu);
    } else {
      EXPECT_THROW((void)make_device("auto"), config_error) << problem;
    }
  } else {
    EXPECT_TRUE(cuda_problem().empty());
  }
}

// Without sticky errors (the rule off), a stream reports its first failure, not a later one.
TEST(StrictRules, WithoutStickyErrorsAStreamReportsItsFirstFailure) {
  auto dev = cpu_without([](auto& r) { r.sticky_errors = false; });
  owned_stream s(*dev);
  dev->launch_kernel(s, [] { throw io_error("first failure", 5); });
  dev->launch_kernel(s, [] { throw usage_error("second failure"); });
  try {
    dev->synchronize_stream(s);
    FAIL() << "the failures were not reported";
  } catch (const io_error& e) {
    EXPECT_NE(std::string(e.what()).find("first failure"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    FAIL() << "reported the later failure: " << e.what();
  }
  dev->launch_kernel(s, [] {});
  dev->synchronize_stream(s);  // reported once, then the stream works on
}
