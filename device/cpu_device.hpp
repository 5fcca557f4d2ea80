// The cpu backend: a real Device made of host memory and threads, used where there is no GPU.
// Device memory is an arena with a hard capacity; each stream is an in-order queue on its own
// worker; H2D and D2H copies run on one copy engine per direction, optionally held to a link
// bandwidth so that overlap behaves as on a PCIe link. It is at least as strict as CUDA
// (device_options::strict_rules): host functions share one callback thread, stream work may not
// call the Device, pageable copies and frees synchronise, failures are sticky.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "device/cpu_access_guard.hpp"
#include "device/device.hpp"

namespace spillway {

/// What the cpu backend counts of the work that CUDA makes expensive (all COUNT, since made).
struct cpu_device_counters {
  std::uint64_t host_functions = 0;       ///< launch_host calls run
  std::uint64_t kernels = 0;              ///< launch_kernel calls run
  std::uint64_t synchronous_copies = 0;   ///< copies made synchronous by pageable host memory
  std::uint64_t synchronizing_frees = 0;  ///< deallocate calls that synchronised the device
};

class cpu_device final : public Device {
 public:
  explicit cpu_device(const device_options& options = {});
  ~cpu_device() override;

  [[nodiscard]] const device_properties& properties() const noexcept override { return props_; }

  [[nodiscard]] void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  [[nodiscard]] std::size_t used_memory() const override;
  [[nodiscard]] std::size_t free_memory() const override;

  [[nodiscard]] void* allocate_pinned(std::size_t bytes) override;
  void deallocate_pinned(void* ptr, std::size_t bytes) noexcept override;

  [[nodiscard]] stream create_stream(stream_priority priority, default_stream_order order) override;
  void destroy_stream(stream s) noexcept override;
  void synchronize_stream(stream s) override;

  [[nodiscard]] event create_event() override;
  void destroy_event(event e) noexcept override;
  void record_event(event e, stream s) override;
  [[nodiscard]] bool query_event(event e) override;
  void synchronize_event(event e) override;
  void stream_wait_event(stream s, event e) override;
  [[nodiscard]] event create_timing_event() override;
  [[nodiscard]] double elapsed_ms(event start, event end) override;

  void copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream s) override;
  void memset_async(void* dst, int value, std::size_t bytes, stream s) override;
  void launch_host(stream s, std::function<void()> work) override;
  void launch_kernel(stream s, std::function<void()> work) override;
  void synchronize() override;
  void make_current() override {}

  // cpu-only controls, for tests and the replay benchmark.

  /// Makes every later item of work on `s` take at least `extra` longer (a slow stream).
  void set_stream_delay(stream s, std::chrono::nanoseconds extra);
  /// Link bandwidth per direction in bytes/s; 0 means unlimited.
  void set_link_bandwidth(double h2d_bytes_per_second, double d2h_bytes_per_second);
  /// Bytes copied so far in one direction.
  [[nodiscard]] std::uint64_t copied_bytes(copy_kind kind) const noexcept;
  /// What the strict rules counted so far.
  [[nodiscard]] cpu_device_counters counters() const noexcept;
  [[nodiscard]] const device_options::strict_rules& rules() const noexcept { return rules_; }
  /// True in device_options::debug_host_access mode (Note [Debug host access]).
  [[nodiscard]] bool debug_host_access() const noexcept { return arena_ != nullptr; }

  struct event_impl;  // public so the event handle's holder can name it

 private:
  struct stream_impl;
  struct host_call;
  struct copy_engine {
    std::mutex busy;                 // one copy at a time per direction, as on a DMA engine
    std::atomic<double> bytes_per_second{0};
    std::chrono::steady_clock::time_point due{};  // when the last copy was due to end (under busy)
    double memcpy_bytes_per_second = 0;           // the last timed copy's memcpy rate (under busy)
  };
  struct work_item {
    std::function<void()> fn;
    bool host_function = false;  // runs on the callback thread
    bool marker = false;         // an event's record or wait: runs even after a sticky failure
  };

  stream_impl& impl(stream s) const;
  static std::shared_ptr<event_impl> impl(event e);
  void enqueue(stream s, std::function<void()> work, bool host_function = false, bool marker = false);
  void wait_drained(stream_impl& q) const;  // returns early when the device is wedged
  void serve(stream_impl& q);
  void run_host_function(stream_impl& q, std::function<void()> fn);
  void serve_callbacks();
  void run_copy(void* dst, const void* src, std::size_t bytes, copy_kind kind);
  void enqueue_mark(stream s, const std::shared_ptr<event_impl>& ev, std::uint64_t generation);
  void wait_event(event_impl& ev, std::uint64_t target) const;  // returns early when wedged
  void fail(std::exception_ptr e) noexcept;  // records a failure of stream work (sticky)
  void rethrow_sticky() const;
  void check_caller(const char* call) const;  // stream work may not call the Device
  [[nodiscard]] bool is_pinned(const void* p, std::size_t bytes) const;
  [[nodiscard]] bool is_device(const void* p, std::size_t bytes) const;  // inside one device block
  [[nodiscard]] bool touches_device(const void* p, std::size_t bytes) const;  // overlaps a device block
  void check_copy_kind(const void* dst, const void* src, std::size_t bytes, copy_kind kind) const;
  void drain_all() noexcept;  // waits for every stream without rethrowing
  void release_block(void* p, std::size_t bytes) noexcept;  // gives a block's memory back

  device_properties props_;
  device_options::strict_rules rules_;
  std::size_t capacity_;
  bool pinned_huge_pages_;
  // Device memory in debug_host_access mode; null otherwise (Note [Debug host access]).
  std::unique_ptr<detail::guarded_arena> arena_;

  mutable std::mutex memory_mutex_;
  std::size_t used_ = 0;
  std::map<std::uintptr_t, std::size_t> device_blocks_;  // start -> rounded bytes, for range lookups
  std::map<std::uintptr_t, std::size_t> pinned_blocks_;  // start -> bytes, for range lookups

  mutable std::mutex streams_mutex_;
  std::list<stream_impl> streams_;
  int next_stream_id_ = 0;

  mutable std::mutex failure_mutex_;
  std::exception_ptr sticky_;     // the first failure of stream work (rules_.sticky_errors)
  std::atomic<bool> wedged_{false};  // the callback thread is held by a host function past the limit

  // The callback thread (Note [Host functions]).
  std::mutex callbacks_mutex_;
  std::condition_variable callbacks_work_;
  std::condition_variable callbacks_done_;
  // Each stream has at most one host function handed over at a time; keyed by the stream's
  // number, so that the seed alone decides the order, not which worker got there first.
  std::map<int, std::shared_ptr<host_call>> ready_calls_;
  std::shared_ptr<host_call> running_call_;
  std::chrono::steady_clock::time_point running_since_{};
  bool callbacks_stopping_ = false;
  std::mt19937_64 callback_order_;
  std::thread callback_thread_;

  std::array<copy_engine, 2> engines_;  // [0] host-to-device, [1] device-to-host
  std::array<std::atomic<std::uint64_t>, 4> copied_{};
  std::atomic<std::uint64_t> host_functions_{0};
  std::atomic<std::uint64_t> kernels_{0};
  std::atomic<std::uint64_t> synchronous_copies_{0};
  std::atomic<std::uint64_t> synchronizing_frees_{0};
};

}  // namespace spillway
