// The device caching allocator: PyTorch/RMM-style pools of segments over an upstream resource,
// with stream-aware reuse, a budget below physical memory, statistics and snapshots.
//
// Sizes: requests are rounded up to 512 bytes. Requests up to 1 MiB come from the small pool
// (2 MiB segments); larger ones from the large pool (20 MiB segments for requests under
// 10 MiB, else the request rounded up to 2 MiB). Blocks are found best fit, split when the
// rest is worth keeping, and merged with free neighbours when freed.
// Budget: the reserved bytes (all segments) never exceed the budget. When a request does not
// fit, cached segments are handed back upstream and the request retried before out_of_memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allocator/address_map.hpp"
#include "allocator/allocator_stats.hpp"
#include "allocator/block_pool.hpp"
#include "allocator/memory_resource.hpp"
#include "allocator/spin_mutex.hpp"

namespace spillway {

struct caching_allocator_options {
  /// Most bytes the allocator may reserve from upstream; 0 = the device's total memory. A
  /// budget above the device's total memory is a config_error.
  std::size_t budget = 0;
};

/// A block as a snapshot reports it. `state` uses PyTorch's names: "active_allocated",
/// "inactive" (free), "active_pending_free" (freed, waiting for its stream).
struct block_info {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;
  const char* state = "inactive";
  void* stream = nullptr;  ///< live: allocation stream; inactive: stream it is free on (null: any)
};

struct segment_info {
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t requested_size = 0;
  void* stream = nullptr;
  const char* segment_type = "large";  ///< "small" or "large"
  std::vector<block_info> blocks;
};

class caching_allocator final : public device_memory_resource {
 public:
  /// Over a device resource of `device` that the allocator owns.
  explicit caching_allocator(Device& device, caching_allocator_options options = {});
  /// Over `upstream` (not owned; it must outlive the allocator). `device` provides events.
  caching_allocator(Device& device, device_memory_resource& upstream, caching_allocator_options options = {});
  ~caching_allocator() override;

  [[nodiscard]] const char* name() const noexcept override { return "caching allocator"; }

  /// Bytes of live blocks now (lock-free read).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return allocated_.load(std::memory_order_relaxed); }
  /// Bytes of segments now (lock-free read).
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t budget() const noexcept { return budget_.load(std::memory_order_relaxed); }
  /// Changes the budget; a budget above the device's total memory (or 0) is a config_error.
  /// Lowering it below the reserved bytes releases cached segments; live ones stay.
  void set_budget(std::size_t bytes);

  /// Gives every cached segment that holds no live block back upstream (waits for streams
  /// that freed blocks into it). Returns the bytes released.
  std::size_t empty_cache();
  /// Waits for `s`, then makes the blocks freed on it usable on any stream. Call before
  /// destroying a stream this allocator has seen.
  void forget_stream(stream s);

  [[nodiscard]] allocator_stats stats() const;
  /// Peaks back to the current values.
  void reset_peak_stats();
  [[nodiscard]] std::vector<segment_info> segments() const;
  /// Walks every pool and throws spillway::error naming the first broken invariant.
  void check_invariants() const;
  [[nodiscard]] Device& device() const noexcept { return *device_; }

 private:
  caching_allocator(Device& device, std::unique_ptr<device_memory_resource> upstream, caching_allocator_options options);
  struct handoff {  // blocks freed on one stream, waiting for an event recorded after the frees
    event done;
    detail::block_pool* pool;
    std::vector<detail::block*> blocks;
  };

  void* do_allocate(std::size_t bytes, stream s) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept override;

  detail::block* find_block(detail::block_pool& pool, std::size_t size, void* s);
  bool grow(detail::block_pool& pool, bool small, std::size_t size, void* s);
  void settle_finished_handoffs();
  void hand_over(detail::block_pool& pool, void* s);
  void wait_for_all_streams();
  std::size_t release_cached();
  std::size_t release_free_segments(detail::block_pool& pool, void* also);
  [[noreturn, gnu::cold]] void throw_larger_than_device(std::size_t bytes);
  [[noreturn, gnu::cold]] void throw_out_of_memory(std::size_t bytes, std::size_t rounded, const std::string& why);
  event take_event();

  Device* device_;
  std::size_t device_total_;
  std::unique_ptr<device_memory_resource> owned_upstream_;
  device_memory_resource* upstream_;
  std::atomic<std::size_t> budget_;
  std::atomic<std::size_t> allocated_{0};
  std::atomic<std::size_t> reserved_{0};

  mutable detail::spin_mutex mutex_;
  detail::block_pool small_;
  detail::block_pool large_;
  detail::address_map<detail::block*> live_;  // live blocks by address
  std::vector<handoff> handoffs_;
  std::vector<event> spare_events_;
  allocator_stats stats_;
};

}  // namespace spillway
