// The cpu backend: a real Device made of host memory and threads, used where there is no GPU.
// Device memory is an arena with a hard capacity; each stream is an in-order queue on its own
// thread; H2D and D2H copies run on one copy engine per direction, optionally held to a link
// bandwidth so that overlap behaves as on a PCIe link.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "device/device.hpp"

namespace spillway {

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

  [[nodiscard]] stream create_stream(stream_priority priority) override;
  void destroy_stream(stream s) noexcept override;
  void synchronize_stream(stream s) override;

  [[nodiscard]] event create_event() override;
  void destroy_event(event e) noexcept override;
  void record_event(event e, stream s) override;
  [[nodiscard]] bool query_event(event e) override;
  void synchronize_event(event e) override;
  void stream_wait_event(stream s, event e) override;

  void copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream s) override;
  void memset_async(void* dst, int value, std::size_t bytes, stream s) override;
  void launch_host(stream s, std::function<void()> work) override;
  void synchronize() override;

  // cpu-only controls, for tests and the replay benchmark.

  /// Makes every later item of work on `s` take at least `extra` longer (a slow stream).
  void set_stream_delay(stream s, std::chrono::nanoseconds extra);
  /// Link bandwidth per direction in bytes/s; 0 means unlimited.
  void set_link_bandwidth(double h2d_bytes_per_second, double d2h_bytes_per_second);
  /// Bytes copied so far in one direction.
  [[nodiscard]] std::uint64_t copied_bytes(copy_kind kind) const noexcept;

 struct event_impl;  // public so the event handle's holder can name it

 private:
  struct stream_impl;
  struct copy_engine {
    std::mutex busy;                 // one copy at a time per direction, as on a DMA engine
    std::atomic<double> bytes_per_second{0};
    std::chrono::steady_clock::time_point due{};  // when the last copy was due to end (under busy)
  };

  stream_impl& impl(stream s) const;
  static std::shared_ptr<event_impl> impl(event e);
  void enqueue(stream s, std::function<void()> work);
  static void serve(stream_impl& q);
  void run_copy(void* dst, const void* src, std::size_t bytes, copy_kind kind);

  device_properties props_;
  std::size_t capacity_;

  mutable std::mutex memory_mutex_;
  std::size_t used_ = 0;
  std::unordered_map<void*, std::size_t> device_blocks_;
  std::unordered_map<void*, std::size_t> pinned_blocks_;

  mutable std::mutex streams_mutex_;
  std::list<stream_impl> streams_;

  std::array<copy_engine, 2> engines_;  // [0] host-to-device, [1] device-to-host
  std::array<std::atomic<std::uint64_t>, 4> copied_{};
};

}  // namespace spillway
