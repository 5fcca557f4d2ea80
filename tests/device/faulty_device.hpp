// faulty_device: a Device that forwards every call to a real one and makes chosen calls fail the
// way the CUDA runtime fails them (out_of_memory for memory the system will not give, cuda_error
// for the rest), for tests of what the library does when the device says no.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "device/device.hpp"
#include "device/error.hpp"

namespace spillway::test {

enum class device_call { allocate, allocate_pinned, create_event, record_event, stream_wait_event, copy_async, count_ };

inline const char* to_string(device_call c) {
  constexpr std::array<const char*, static_cast<std::size_t>(device_call::count_)> names{
      "allocate", "allocate_pinned", "create_event", "record_event", "stream_wait_event", "copy_async"};
  return names[static_cast<std::size_t>(c)];
}

/// Which calls of one kind fail: after `skip` calls that pass, the next `count` calls of at least
/// `min_bytes` bytes (for the calls that take a size; 0 for the others) throw.
struct fault_rule {
  std::uint64_t skip = 0;
  std::uint64_t count = std::numeric_limits<std::uint64_t>::max();
  std::size_t min_bytes = 0;
};

class faulty_device final : public Device {
 public:
  explicit faulty_device(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}

  /// From now on, calls of kind `c` fail as `r` says (replacing any earlier rule for `c`).
  void fail(device_call c, fault_rule r = {}) {
    std::lock_guard lock(m_);
    slot(c) = state{true, r, 0};
    failures_[static_cast<std::size_t>(c)] = 0;
  }
  /// Calls of kind `c` pass again.
  void heal(device_call c) {
    std::lock_guard lock(m_);
    slot(c).armed = false;
  }
  /// Calls of kind `c` that failed since its rule was last set.
  [[nodiscard]] std::uint64_t failures(device_call c) const {
    std::lock_guard lock(m_);
    return failures_[static_cast<std::size_t>(c)];
  }
  [[nodiscard]] Device& inner() noexcept { return *inner_; }

  [[nodiscard]] const device_properties& properties() const noexcept override { return inner_->properties(); }
  [[nodiscard]] void* allocate(std::size_t b) override {
    maybe_fail(device_call::allocate, b);
    return inner_->allocate(b);
  }
  void deallocate(void* p, std::size_t b) noexcept override { inner_->deallocate(p, b); }
  [[nodiscard]] std::size_t used_memory() const override { return inner_->used_memory(); }
  [[nodiscard]] std::size_t free_memory() const override { return inner_->free_memory(); }
  /// Runs at the start of every allocate_pinned (a test holds pinning up with it, as a slow
  /// cudaHostRegister would); set before the device is shared between threads.
  std::function<void()> before_pinning;

  [[nodiscard]] void* allocate_pinned(std::size_t b) override {
    if (before_pinning) before_pinning();
    maybe_fail(device_call::allocate_pinned, b);
    return inner_->allocate_pinned(b);
  }
  void deallocate_pinned(void* p, std::size_t b) noexcept override { inner_->deallocate_pinned(p, b); }
  [[nodiscard]] stream create_stream(stream_priority p, default_stream_order o) override {
    return inner_->create_stream(p, o);
  }
  void destroy_stream(stream s) noexcept override { inner_->destroy_stream(s); }
  void synchronize_stream(stream s) override { inner_->synchronize_stream(s); }
  [[nodiscard]] event create_event() override {
    maybe_fail(device_call::create_event, 0);
    return inner_->create_event();
  }
  void destroy_event(event e) noexcept override { inner_->destroy_event(e); }
  void record_event(event e, stream s) override {
    maybe_fail(device_call::record_event, 0);
    inner_->record_event(e, s);
  }
  [[nodiscard]] bool query_event(event e) override { return inner_->query_event(e); }
  void synchronize_event(event e) override { inner_->synchronize_event(e); }
  void stream_wait_event(stream s, event e) override {
    maybe_fail(device_call::stream_wait_event, 0);
    inner_->stream_wait_event(s, e);
  }
  [[nodiscard]] event create_timing_event() override { return inner_->create_timing_event(); }
  [[nodiscard]] double elapsed_ms(event a, event b) override { return inner_->elapsed_ms(a, b); }
  void copy_async(void* d, const void* s, std::size_t n, copy_kind k, stream st) override {
    maybe_fail(device_call::copy_async, n);
    inner_->copy_async(d, s, n, k, st);
  }
  void memset_async(void* d, int v, std::size_t n, stream s) override { inner_->memset_async(d, v, n, s); }
  void launch_host(stream s, std::function<void()> w) override { inner_->launch_host(s, std::move(w)); }
  void launch_kernel(stream s, std::function<void()> w) override { inner_->launch_kernel(s, std::move(w)); }
  void synchronize() override { inner_->synchronize(); }
  void make_current() override { inner_->make_current(); }

 private:
  struct state {
    bool armed = false;
    fault_rule rule;
    std::uint64_t seen = 0;  // matching calls since the rule was set
  };
  state& slot(device_call c) { return rules_[static_cast<std::size_t>(c)]; }

  void maybe_fail(device_call c, std::size_t bytes) {
    {
      std::lock_guard lock(m_);
      state& st = slot(c);
      if (!st.armed || bytes < st.rule.min_bytes) return;
      const std::uint64_t k = st.seen++;
      if (k < st.rule.skip || k - st.rule.skip >= st.rule.count) return;
      ++failures_[static_cast<std::size_t>(c)];
    }
    const std::string what = std::string("faulty device: ") + to_string(c) + " refused (injected)";
    if (c == device_call::allocate || c == device_call::allocate_pinned) throw out_of_memory(what);
    throw cuda_error(what);
  }

  std::unique_ptr<Device> inner_;
  mutable std::mutex m_;
  std::array<state, static_cast<std::size_t>(device_call::count_)> rules_{};
  std::array<std::uint64_t, static_cast<std::size_t>(device_call::count_)> failures_{};
};

}  // namespace spillway::test
