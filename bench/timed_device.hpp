// timed_device: a Device that forwards every call to another and adds up the calling thread's
// CPU time spent inside them, for the overhead benchmark (what the host spends beyond the
// Device's own work). Reading the thread's CPU clock is a system call that costs about as much
// as the calls it times, and each timed call leaves the cost of about one read outside the
// timed interval too; so the calls are counted, and the benchmark takes calls times the cost of
// one read (probe_ns, measured in the same run) off the time outside. (Timing by the steady
// clock instead would count the time a call is preempted as time inside it, and so flatter
// the host on a loaded machine.)
#pragma once

#include <time.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "device/device.hpp"

namespace spillway::bench {

/// CPU time of the calling thread, in nanoseconds.
inline std::uint64_t thread_cpu_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(t.tv_nsec);
}

class timed_device final : public Device {
 public:
  explicit timed_device(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}

  /// CPU time the calling thread has spent inside this device's calls so far (only the thread
  /// that is measured calls this; other threads' calls add to their own counter).
  [[nodiscard]] static std::uint64_t inside_ns() noexcept { return inside(); }
  /// Device calls the calling thread has made through any timed_device so far.
  [[nodiscard]] static std::uint64_t calls() noexcept { return count(); }
  /// CPU time of one read of the thread's CPU clock, measured now over `reads` reads.
  [[nodiscard]] static double probe_ns(int reads = 20000) {
    const auto t0 = thread_cpu_ns();
    for (int i = 0; i < reads; ++i) (void)thread_cpu_ns();
    return static_cast<double>(thread_cpu_ns() - t0) / (reads + 1);
  }

  [[nodiscard]] const device_properties& properties() const noexcept override { return inner_->properties(); }
  [[nodiscard]] void* allocate(std::size_t b) override { return timed([&] { return inner_->allocate(b); }); }
  void deallocate(void* p, std::size_t b) noexcept override { timed([&] { inner_->deallocate(p, b); }); }
  [[nodiscard]] std::size_t used_memory() const override { return timed([&] { return inner_->used_memory(); }); }
  [[nodiscard]] std::size_t free_memory() const override { return timed([&] { return inner_->free_memory(); }); }
  [[nodiscard]] void* allocate_pinned(std::size_t b) override { return timed([&] { return inner_->allocate_pinned(b); }); }
  void deallocate_pinned(void* p, std::size_t b) noexcept override { timed([&] { inner_->deallocate_pinned(p, b); }); }
  [[nodiscard]] stream create_stream(stream_priority p, default_stream_order o) override {
    return timed([&] { return inner_->create_stream(p, o); });
  }
  void destroy_stream(stream s) noexcept override { timed([&] { inner_->destroy_stream(s); }); }
  void synchronize_stream(stream s) override { timed([&] { inner_->synchronize_stream(s); }); }
  [[nodiscard]] event create_event() override { return timed([&] { return inner_->create_event(); }); }
  void destroy_event(event e) noexcept override { timed([&] { inner_->destroy_event(e); }); }
  void record_event(event e, stream s) override { timed([&] { inner_->record_event(e, s); }); }
  [[nodiscard]] bool query_event(event e) override { return timed([&] { return inner_->query_event(e); }); }
  void synchronize_event(event e) override { timed([&] { inner_->synchronize_event(e); }); }
  void stream_wait_event(stream s, event e) override { timed([&] { inner_->stream_wait_event(s, e); }); }
  [[nodiscard]] event create_timing_event() override { return timed([&] { return inner_->create_timing_event(); }); }
  [[nodiscard]] double elapsed_ms(event a, event b) override { return timed([&] { return inner_->elapsed_ms(a, b); }); }
  void copy_async(void* d, const void* s, std::size_t n, copy_kind k, stream st) override {
    timed([&] { inner_->copy_async(d, s, n, k, st); });
  }
  void memset_async(void* d, int v, std::size_t n, stream s) override { timed([&] { inner_->memset_async(d, v, n, s); }); }
  void launch_host(stream s, std::function<void()> w) override { timed([&] { inner_->launch_host(s, std::move(w)); }); }
  void launch_kernel(stream s, std::function<void()> w) override { timed([&] { inner_->launch_kernel(s, std::move(w)); }); }
  void synchronize() override { timed([&] { inner_->synchronize(); }); }
  void make_current() override { timed([&] { inner_->make_current(); }); }

 private:
  static std::uint64_t& inside() noexcept {
    thread_local std::uint64_t ns = 0;
    return ns;
  }
  static std::uint64_t& count() noexcept {
    thread_local std::uint64_t n = 0;
    return n;
  }
  template <class F>
  static auto timed(F&& f) -> decltype(f()) {
    ++count();
    struct add_on_exit {
      std::uint64_t t0 = thread_cpu_ns();
      ~add_on_exit() { inside() += thread_cpu_ns() - t0; }
    } guard;
    return f();
  }

  std::unique_ptr<Device> inner_;
};

}  // namespace spillway::bench
