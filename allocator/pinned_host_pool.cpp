// Pinned host pool: carves large pinned regions into 4 KiB-granular blocks, best fit.
// See the glossary in pinned_host_pool.hpp; Note [Pinned regions] explains how regions grow.
#include "allocator/pinned_host_pool.hpp"

#include <algorithm>
#include <cassert>
#include <exception>
#include <string>

#include "device/error.hpp"
#include "device/log.hpp"
#include "device/units.hpp"

namespace spillway {

// Note [Pinned regions]
// Pinning is slow (the cuda backend registers every page with the driver) and io_uring wants
// few, large fixed buffers, so the pool pins `region_size` bytes at a time and carves blocks out
// of them. A request larger than a quarter of region_size gets a region of exactly its (aligned)
// size: packing such blocks into shared regions strands tails too small for the next one (on a
// transformer's host tier that cost 12% over requested bytes). When no free block fits a
// request, the regions that hold no live block are unpinned before a new one is pinned: none of
// them can hold the request, and after a change of shapes (another batch size) they would
// otherwise stay pinned for sizes that no longer come. Growth is rare in a training loop, so the
// cost of pinning again is paid at shape changes only. With both rules the host tier of a
// transformer stays within 5% of the bytes requested. Under a capacity limit the
// last region is shrunk to what the limit leaves. Blocks never cross regions: a region is one io_uring
// fixed buffer, and a transfer must lie inside one.

struct detail::pinned_region_impl {
  void* mapping = nullptr;       // what allocate_pinned returned
  std::size_t mapped_bytes = 0;  // what was asked of allocate_pinned
  std::uintptr_t begin = 0;      // first aligned byte
  std::size_t bytes = 0;         // usable bytes from begin (a multiple of the alignment)
  std::size_t live_blocks = 0;
  std::uint64_t id = 0;          // pinned_region::id
};

struct pinned_host_pool::region : detail::pinned_region_impl {};

namespace {
constexpr std::size_t page_size = 4096;

bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }
}  // namespace

pinned_host_pool::pinned_host_pool(Device& device, pinned_pool_options options)
    : device_(&device), options_(options) {
  if (!is_power_of_two(options_.alignment)) {
    throw config_error("pinned host pool: pinned_pool_options.alignment must be a power of two, got " +
                       std::to_string(options_.alignment));
  }
  if (options_.region_size == 0 || options_.region_size > max_size_bytes) {
    throw config_error("pinned host pool: pinned_pool_options.region_size must be between 1 B and " + format_bytes(max_size_bytes) +
                       ", got " + std::to_string(options_.region_size) + " B");
  }
  if (options_.capacity > max_size_bytes) {
    throw config_error("pinned host pool: pinned_pool_options.capacity " + format_bytes(options_.capacity) + " is above the limit of " +
                       format_bytes(max_size_bytes));
  }
  options_.region_size = round_up(options_.region_size, std::max(options_.alignment, page_size));
}

pinned_host_pool::~pinned_host_pool() {
  if (stats_.allocated_bytes != 0) {
    log(log_level::warning, "pinned host pool destroyed with " + format_bytes(stats_.allocated_bytes) +
                                " still allocated; those blocks are unpinned now");
  }
  for (auto& r : regions_) device_->deallocate_pinned(r->mapping, r->mapped_bytes);
}

void* pinned_host_pool::allocate(std::size_t bytes) {
  if (bytes == 0 || bytes > max_size_bytes) {
    throw config_error("pinned host pool: cannot allocate " + std::to_string(bytes) +
                       " B (sizes must be between 1 B and " + format_bytes(max_size_bytes) + ")");
  }
  const std::size_t rounded = round_up(bytes, options_.alignment);
  std::unique_lock lock(mutex_);
  if (auto f = free_.lower_bound({rounded, 0}); f != free_.end()) return carve(blocks_.find(f->second), rounded, bytes);

  // No free block fits: unpin the empty regions (none can hold this request) and pin a new
  // region (Note [Pinned regions]), both outside the lock (Note [Pinning outside the lock]).
  auto unused = take_unused_locked();
  std::size_t region_bytes = rounded > options_.region_size / 4 ? rounded : options_.region_size;
  if (options_.capacity != 0) {
    const std::size_t taken = stats_.reserved_bytes + pinning_bytes_;
    const std::size_t room = options_.capacity - std::min(options_.capacity, taken);
    if (rounded > room) {
      std::exception_ptr full;
      try {
        throw_out_of_memory(bytes, "the capacity is reached");
      } catch (...) {
        full = std::current_exception();
      }
      lock.unlock();
      unpin(std::move(unused));
      std::rethrow_exception(full);
    }
    region_bytes = std::min(region_bytes, room / options_.alignment * options_.alignment);
  }
  pinning_bytes_ += region_bytes;  // held against the capacity while it is pinned
  lock.unlock();
  unpin(std::move(unused));
  // A pin that fails in any way gives its bytes back to the capacity (the lock is not held here).
  const auto give_back = [&] {
    lock.lock();
    pinning_bytes_ -= region_bytes;
  };
  std::unique_ptr<region> r;
  try {
    r = pin(region_bytes);
  } catch (const out_of_memory&) {
    // The system refused to pin more. Give back empty regions and try once more, smaller.
    lock.lock();
    pinning_bytes_ -= region_bytes - rounded;
    region_bytes = rounded;
    unused = take_unused_locked();
    lock.unlock();
    unpin(std::move(unused));
    try {
      r = pin(region_bytes);
    } catch (const out_of_memory& e) {
      give_back();
      throw_out_of_memory(bytes, std::string("the device refused to pin more: ") + e.what());
    } catch (...) {
      give_back();
      throw;
    }
  } catch (...) {
    give_back();
    throw;
  }
  lock.lock();
  pinning_bytes_ -= region_bytes;
  add_region(std::move(r));
  auto f = free_.lower_bound({rounded, 0});
  assert(f != free_.end());
  return carve(blocks_.find(f->second), rounded, bytes);
}

// Note [Pinning outside the lock]
// Pinning and unpinning are slow on a GPU (cudaHostRegister and cudaHostUnregister walk every
// page: tens of milliseconds for a region of 64 MiB, more for a tensor-sized one), and the
// pool's other users do not wait for them: frees come from the NVMe ring's thread and the event
// worker as copies complete. So the lock covers the bookkeeping only. A region being pinned
// holds its bytes against the capacity (pinning_bytes_) but is in no list, nor in the stats,
// until it is added, so nothing carves from it early; an empty region taken for unpinning
// leaves the lists (and the generation changes) before its pages go. Two threads that find no
// fit at once may each pin a region: the second is simply used by later requests.

std::unique_ptr<pinned_host_pool::region> pinned_host_pool::pin(std::size_t bytes) {
  const std::size_t align = std::max(options_.alignment, page_size);
  const std::size_t mapped = bytes + (align - page_size);  // room to align the base
  auto r = std::make_unique<region>();
  r->mapping = device_->allocate_pinned(mapped);
  r->mapped_bytes = mapped;
  r->begin = round_up(reinterpret_cast<std::uintptr_t>(r->mapping), align);
  r->bytes = bytes;
  return r;
}

void pinned_host_pool::unpin(std::vector<std::unique_ptr<region>> regions) noexcept {
  for (auto& r : regions) device_->deallocate_pinned(r->mapping, r->mapped_bytes);
}

void pinned_host_pool::add_region(std::unique_ptr<region> r) {
  r->id = next_region_id_++;
  blocks_.emplace(r->begin, detail::pinned_block{r->bytes, 0, r.get(), true});
  free_.emplace(r->bytes, r->begin);
  stats_.reserved_bytes += r->bytes;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.regions;
  regions_.push_back(std::move(r));
  generation_.fetch_add(1, std::memory_order_release);
}

void* pinned_host_pool::carve(std::map<std::uintptr_t, detail::pinned_block>::iterator it, std::size_t rounded,
                              std::size_t requested) {
  auto& b = it->second;
  assert(b.free && b.size >= rounded);
  free_.erase({b.size, it->first});
  if (b.size > rounded) {  // split: the tail stays free
    const std::uintptr_t tail = it->first + rounded;
    blocks_.emplace_hint(std::next(it), tail, detail::pinned_block{b.size - rounded, 0, b.region, true});
    free_.emplace(b.size - rounded, tail);
    b.size = rounded;
  }
  b.free = false;
  b.requested = requested;
  ++b.region->live_blocks;
  stats_.requested_bytes += requested;
  stats_.allocated_bytes += rounded;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.allocations;
  return reinterpret_cast<void*>(it->first);
}

void pinned_host_pool::deallocate(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
  assert(it != blocks_.end() && !it->second.free && "pinned host pool: freeing a pointer it did not hand out");
  if (it == blocks_.end() || it->second.free) return;
  assert(it->second.requested == bytes && "pinned host pool: deallocate size differs from allocate size");
  (void)bytes;
  auto& b = it->second;
  stats_.requested_bytes -= b.requested;
  stats_.allocated_bytes -= b.size;
  --b.region->live_blocks;
  b.free = true;
  b.requested = 0;
  // Coalesce with the next and previous blocks when they are free and in the same region.
  if (auto next = std::next(it); next != blocks_.end() && next->second.free && next->second.region == b.region) {
    free_.erase({next->second.size, next->first});
    b.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.region == b.region) {
      free_.erase({prev->second.size, prev->first});
      prev->second.size += b.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  free_.emplace(it->second.size, it->first);
}

std::size_t pinned_host_pool::release_unused() {
  std::size_t released = 0;
  std::vector<std::unique_ptr<region>> unused;
  {
    std::lock_guard lock(mutex_);
    unused = take_unused_locked();
  }
  for (const auto& r : unused) released += r->bytes;
  unpin(std::move(unused));
  return released;
}

std::vector<std::unique_ptr<pinned_host_pool::region>> pinned_host_pool::take_unused_locked() {
  std::vector<std::unique_ptr<region>> out;
  std::erase_if(regions_, [&](std::unique_ptr<region>& r) {
    if (r->live_blocks != 0) return false;
    // An empty region is a single free block (freeing coalesces it back to one).
    auto it = blocks_.find(r->begin);
    assert(it != blocks_.end() && it->second.free && it->second.size == r->bytes);
    free_.erase({it->second.size, it->first});
    blocks_.erase(it);
    stats_.reserved_bytes -= r->bytes;
    --stats_.regions;
    out.push_back(std::move(r));
    return true;
  });
  if (!out.empty()) generation_.fetch_add(1, std::memory_order_release);
  return out;
}

std::vector<pinned_region> pinned_host_pool::regions() const {
  std::lock_guard lock(mutex_);
  std::vector<pinned_region> out;
  out.reserve(regions_.size());
  for (const auto& r : regions_) out.push_back({reinterpret_cast<void*>(r->begin), r->bytes, r->id});
  return out;
}

int pinned_host_pool::region_index(const void* ptr) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    if (p >= regions_[i]->begin && p - regions_[i]->begin < regions_[i]->bytes) return static_cast<int>(i);
  }
  return -1;
}

pinned_pool_stats pinned_host_pool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::size_t pinned_host_pool::largest_free_block() const {
  std::lock_guard lock(mutex_);
  return free_.empty() ? 0 : free_.rbegin()->first;
}

void pinned_host_pool::throw_out_of_memory(std::size_t bytes, const std::string& why) const {
  throw out_of_memory("pinned host pool: out of memory allocating " + format_bytes(bytes) + " (" + why +
                      "): capacity " + (options_.capacity == 0 ? std::string("unlimited") : format_bytes(options_.capacity)) +
                      ", reserved " + format_bytes(stats_.reserved_bytes) + ", allocated " +
                      format_bytes(stats_.allocated_bytes) + ", largest free block " +
                      format_bytes(free_.empty() ? 0 : free_.rbegin()->first) + " in " +
                      std::to_string(regions_.size()) + " regions");
}

void pinned_host_pool::check_invariants() const {
  std::lock_guard lock(mutex_);
  const std::string broken = "pinned host pool invariant broken: ";
  std::size_t blocks_seen = 0, free_seen = 0, allocated = 0, requested = 0, reserved = 0;
  for (const auto& r : regions_) {
    reserved += r->bytes;
    std::uintptr_t at = r->begin;
    std::size_t live = 0;
    bool prev_free = false;
    for (auto it = blocks_.find(r->begin); at < r->begin + r->bytes; ++it) {
      SPILLWAY_EXPECTS(it != blocks_.end() && it->first == at,
                       broken + "blocks do not tile a region (gap at " + std::to_string(at) + ")");
      const auto& b = it->second;
      SPILLWAY_EXPECTS(b.region == r.get(), broken + "a block names the wrong region");
      SPILLWAY_EXPECTS(b.size != 0 && b.size % options_.alignment == 0,
                       broken + "a block size is not a multiple of the alignment");
      SPILLWAY_EXPECTS(!(b.free && prev_free), broken + "two neighbouring free blocks were not merged");
      if (b.free) {
        SPILLWAY_EXPECTS((free_.contains({b.size, it->first})), broken + "a free block is missing from the free index");
        ++free_seen;
      } else {
        SPILLWAY_EXPECTS(b.requested != 0 && b.requested <= b.size, broken + "a live block's requested size is wrong");
        allocated += b.size;
        requested += b.requested;
        ++live;
      }
      prev_free = b.free;
      at += b.size;
      ++blocks_seen;
    }
    SPILLWAY_EXPECTS(at == r->begin + r->bytes, broken + "blocks overrun a region");
    SPILLWAY_EXPECTS(live == r->live_blocks, broken + "a region's live block count is wrong");
  }
  SPILLWAY_EXPECTS(blocks_seen == blocks_.size(), broken + "blocks outside every region");
  SPILLWAY_EXPECTS(free_seen == free_.size(), broken + "the free index holds blocks that are not free");
  SPILLWAY_EXPECTS(allocated == stats_.allocated_bytes && requested == stats_.requested_bytes &&
                       reserved == stats_.reserved_bytes && regions_.size() == stats_.regions,
                   broken + "statistics disagree with the blocks");
}

}  // namespace spillway
