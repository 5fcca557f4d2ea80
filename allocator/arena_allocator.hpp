// Arena allocator: the device budget (device_budget.hpp) reserved once as one region and carved
// best fit, with free neighbours merged at once. The runtime's one device allocator: the executor
// places every tensor and every op's scratch here.
//
// Why one region and not pools. A PyTorch/RMM-style pool allocator keeps small and large requests
// in separate segments of fixed sizes, which serves a training loop with memory to spare. Under a
// budget that a plan fills to the last few percent, such segments fragment (a small tensor pins a
// 2 MiB segment; a large free block cannot serve a small request), and a second pool beside the
// arena would take a slice of the budget the plan could not use. One region with best fit and
// immediate coalescing (the shape of TensorFlow's BFC allocator, which IBM's LMS ran on) fragments
// far less, never reserves more than the budget, and can place at addresses a layout chose.
//
// Streams (Note [Arena handoff]). A freed block remembers the stream that last used it and an
// event recorded there at the free, with the byte range it covers. Allocating bytes for another
// stream makes that stream wait on the events whose ranges they overlap (a device-side wait, no
// host stall): bytes are handed over only after the event shows the first stream is done with
// them. Merged blocks keep the events of all their parts, each with its range, so carving a
// block out of a large free one waits only for the earlier users of the bytes it takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/device_budget.hpp"
#include "allocator/memory_resource.hpp"
#include "device/device.hpp"
#include "device/event_pool.hpp"

namespace spillway {

struct arena_stats {
  std::size_t capacity_bytes = 0;        ///< the region
  std::size_t allocated_bytes = 0;       ///< SUM of live blocks (rounded)
  std::size_t peak_allocated_bytes = 0;
  std::size_t largest_free_bytes = 0;
  std::uint64_t allocations = 0;         ///< COUNT of allocate() calls that succeeded
  std::uint64_t stream_handoffs = 0;     ///< COUNT of device waits inserted for a cross-stream reuse
  std::uint64_t failures = 0;            ///< COUNT of out_of_memory thrown
};

class arena_allocator final : public device_memory_resource {
 public:
  /// Reserves the budget's bytes (rounded up to the granule) from `upstream` (not owned; it must
  /// outlive the arena) at once. A budget of 0 or above the device's memory is a config_error.
  arena_allocator(Device& device, device_memory_resource& upstream, device_budget budget);
  ~arena_allocator() override;

  [[nodiscard]] const char* name() const noexcept override { return "arena allocator"; }
  /// Granule of every block: the budget's (and so of the least budget an op's tensors need).
  static constexpr std::size_t granule = device_budget::granule;
  [[nodiscard]] arena_stats stats() const;
  /// The budget the region was reserved for: the one the executor keeps within.
  [[nodiscard]] const device_budget& budget() const noexcept { return budget_; }
  /// Bytes of the region.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// Gives the region back and reserves one for `budget` (checked as the constructor does).
  /// Every block must be free (a usage_error otherwise); waits for the work that used them. When
  /// the device cannot give the new region (out_of_memory), the old one is reserved again.
  void set_budget(device_budget budget);
  /// Allocates exactly [offset, offset + bytes rounded to the granule) of the region for `s` if
  /// that range lies within one free block (with the same stream handoff as allocate), else
  /// returns nullptr and changes nothing. For callers that planned the layout themselves
  /// (prefetch/layout.hpp). `offset` must be a multiple of the granule.
  [[nodiscard]] void* try_allocate_at(std::size_t offset, std::size_t bytes, stream s);
  /// Allocates the last `bytes` (rounded) of the highest free block that holds them, with the
  /// same stream handoff as allocate, or returns nullptr. For short-lived memory (an op's
  /// scratch): a layout packs from address 0 up, so the top of the region is where it plans least.
  [[nodiscard]] void* try_allocate_high(std::size_t bytes, stream s);
  /// Offset in the region of a pointer this arena returned.
  [[nodiscard]] std::size_t offset_of(const void* p) const noexcept {
    return static_cast<std::size_t>(static_cast<const std::byte*>(p) - base_);
  }
  /// Waits for the frees made on `s` so the stream may be destroyed.
  void forget_stream(stream s);

 private:
  struct dependency {
    void* stream;                    // the stream whose work must finish first
    std::shared_ptr<void> done;      // owns an event recorded on it after the free
    std::size_t lo, hi;              // the bytes [lo, hi) of the region that work may touch
  };
  struct block {
    std::size_t size = 0;
    bool free = true;
    std::vector<dependency> deps;    // free blocks: work that may still touch the bytes
  };

  void* do_allocate(std::size_t bytes, stream s) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept override;
  void index_free(std::size_t offset, std::size_t size);
  void unindex_free(std::size_t offset, std::size_t size);
  void prune(std::vector<dependency>& deps) noexcept;
  void merge_and_index(std::map<std::size_t, block>::iterator it);  // a free block joins its free neighbours
  static std::vector<dependency> within(const std::vector<dependency>& deps, std::size_t lo, std::size_t hi);
  void* take(std::map<std::size_t, block>::iterator it, std::size_t offset, std::size_t need, stream s);
  void* allocate_at_locked(std::size_t offset, std::size_t need, stream s);  // try_allocate_at, rounded
  void reserve(device_budget budget);  // the region for `budget`, one free block
  void wait_for_frees();               // every dependency of every block has finished

  Device* device_;
  std::shared_ptr<event_pool> events_;  // the events recorded after frees
  device_memory_resource* upstream_;
  device_budget budget_;
  std::size_t capacity_ = 0;
  std::byte* base_ = nullptr;
  mutable std::mutex mutex_;
  std::map<std::size_t, block> blocks_;               // by offset
  std::multimap<std::size_t, std::size_t> by_size_;  // free blocks: size -> offset
  arena_stats stats_;
};

}  // namespace spillway
