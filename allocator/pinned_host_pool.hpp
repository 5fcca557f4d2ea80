// Pinned host pool: large pinned regions from Device::allocate_pinned (anonymous memory on the
// GPU's NUMA node), carved into blocks without power-of-two rounding waste.
// The swap tiers keep tensor bytes here, and io_uring registers the regions as fixed buffers so
// one buffer serves both the GPU copy and the NVMe transfer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "device/device.hpp"

namespace spillway {

struct pinned_pool_options {
  /// Most bytes the pool may pin in total (its regions); past it allocate() throws
  /// out_of_memory. 0 = no limit.
  std::size_t capacity = 0;
  /// Size of each region the pool pins at once (a request larger than this gets a region of its
  /// own, rounded up to the page size; so does one larger than a quarter of it, see the .cpp).
  std::size_t region_size = std::size_t{256} << 20;
  /// Alignment and rounding granule of every block (4096 suits O_DIRECT).
  std::size_t alignment = 4096;
};

struct pinned_pool_stats {
  std::size_t requested_bytes = 0;      ///< SUM of bytes asked for by live blocks
  std::size_t allocated_bytes = 0;      ///< SUM of bytes of live blocks after rounding
  std::size_t reserved_bytes = 0;       ///< SUM of bytes of pinned regions
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  std::uint64_t allocations = 0;        ///< COUNT of allocate() calls that succeeded
  std::uint64_t regions = 0;            ///< COUNT of live regions
};

/// One pinned region, as io_uring registers it (iovec-like).
struct pinned_region {
  void* base = nullptr;
  std::size_t bytes = 0;
  /// Unique for the pool's life: a region pinned again at the same address and size (mmap
  /// often hands a freed range back) is a new region, whose pages io_uring must register anew.
  std::uint64_t id = 0;
};

namespace detail {
struct pinned_region_impl;

/// One block of a region: a run of bytes either handed out (live) or free.
struct pinned_block {
  std::size_t size = 0;       ///< bytes, a multiple of the alignment
  std::size_t requested = 0;  ///< bytes asked for (live blocks only)
  pinned_region_impl* region = nullptr;
  bool free = true;
};
}  // namespace detail

// Glossary. A *region* is one allocation from Device::allocate_pinned; it is carved into
// *blocks* that tile it exactly (no gaps), each free or live. Requests are rounded up to the
// alignment only (4 KiB by default): a 5 MiB + 1 B request costs 5 MiB + 4 KiB, not 8 MiB.
// Free blocks are found best-fit (smallest that fits, lowest address on ties), split when
// larger than needed, and merged with free neighbours of the same region when freed.
class pinned_host_pool {
 public:
  pinned_host_pool(Device& device, pinned_pool_options options = {});
  ~pinned_host_pool();
  pinned_host_pool(const pinned_host_pool&) = delete;
  pinned_host_pool& operator=(const pinned_host_pool&) = delete;

  /// A block of at least `bytes` bytes, aligned to options.alignment. Thread-safe.
  /// Throws out_of_memory (saying requested, capacity, reserved, allocated) when it cannot.
  [[nodiscard]] void* allocate(std::size_t bytes);
  /// Returns a block; `bytes` is what was asked for. Thread-safe.
  void deallocate(void* ptr, std::size_t bytes) noexcept;

  /// Unpins regions that hold no live block; returns the bytes released.
  std::size_t release_unused();

  /// The regions currently pinned, for io_uring buffer registration.
  [[nodiscard]] std::vector<pinned_region> regions() const;
  /// Changes whenever a region is pinned or unpinned (release order: a reader that sees a value
  /// sees the regions as they were when it was set). A fixed-buffer registration made from
  /// regions() read after generation() returned g still describes every live block while
  /// generation() returns g: a block's region outlives the block.
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }
  /// Index of the region holding `ptr` in regions(), or -1.
  [[nodiscard]] int region_index(const void* ptr) const;

  [[nodiscard]] pinned_pool_stats stats() const;
  [[nodiscard]] const pinned_pool_options& options() const noexcept { return options_; }
  [[nodiscard]] Device& device() const noexcept { return *device_; }

  /// Bytes of the largest free block (0 when none). Thread-safe.
  [[nodiscard]] std::size_t largest_free_block() const;
  /// Walks every region and free list and throws spillway::error naming the first broken
  /// invariant (blocks tile each region, no two free neighbours, free index and stats agree).
  /// For tests and SPILLWAY_DEBUG builds; O(blocks).
  void check_invariants() const;

 private:
  struct region;
  using free_key = std::pair<std::size_t, std::uintptr_t>;  // (size, address): best fit first

  void* carve(std::map<std::uintptr_t, detail::pinned_block>::iterator it, std::size_t rounded,
              std::size_t requested);
  // Note [Pinning outside the lock] in pinned_host_pool.cpp: pin and unpin run unlocked.
  [[nodiscard]] std::unique_ptr<region> pin(std::size_t bytes);
  void unpin(std::vector<std::unique_ptr<region>> regions) noexcept;
  void add_region(std::unique_ptr<region> r);
  [[nodiscard]] std::vector<std::unique_ptr<region>> take_unused_locked();
  [[noreturn]] void throw_out_of_memory(std::size_t bytes, const std::string& why) const;

  Device* device_;
  pinned_pool_options options_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<region>> regions_;
  pinned_pool_stats stats_;
  std::map<std::uintptr_t, detail::pinned_block> blocks_;  // every block, by address
  std::set<free_key> free_;                                // free blocks, by size then address
  std::uint64_t next_region_id_ = 1;
  std::size_t pinning_bytes_ = 0;  // of regions being pinned, held against the capacity
  std::atomic<std::uint64_t> generation_{0};
};

}  // namespace spillway
