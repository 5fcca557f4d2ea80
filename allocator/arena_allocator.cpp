// Arena allocator: best fit over one reserved region, coalescing on free, and stream handoff by
// device-side event waits (Note [Arena handoff] in the header).
#include "allocator/arena_allocator.hpp"

#include <algorithm>
#include <cstdlib>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway {

arena_allocator::arena_allocator(Device& device, device_memory_resource& upstream, device_budget budget)
    : device_(&device), events_(std::make_shared<event_pool>(device)), upstream_(&upstream) {
  reserve(budget);
}

arena_allocator::~arena_allocator() {
  try {
    wait_for_frees();
  } catch (...) {  // NOLINT(bugprone-empty-catch): the device failed; its stream work reported that error
  }
  blocks_.clear();
  upstream_->deallocate(base_, capacity_, stream{});
}

void arena_allocator::reserve(device_budget budget) {
  budget.check_fits(*device_);
  const std::size_t total = device_->properties().total_memory;
  capacity_ = std::min<std::size_t>(round_up(budget.bytes(), granule), total / granule * granule);
  try {
    base_ = static_cast<std::byte*>(upstream_->allocate(capacity_, stream{}));
  } catch (const out_of_memory& e) {
    // Another process, or memory this one holds outside the arena, took what the budget needs.
    std::string free_now = "unknown";
    try {
      free_now = format_bytes(device_->free_memory());
    } catch (...) {  // NOLINT(bugprone-empty-catch): the message goes without the figure
    }
    throw out_of_memory("arena allocator: the device would not give the " + format_bytes(capacity_) +
                        " region of a device budget of " + format_bytes(budget.bytes()) + " (free now: " + free_now +
                        "): " + e.what() + "; give a smaller device budget, or free device memory held elsewhere");
  }
  budget_ = budget;
  blocks_.clear();
  by_size_.clear();
  blocks_[0] = block{capacity_, true, {}};
  index_free(0, capacity_);
  stats_ = arena_stats{};
  stats_.capacity_bytes = capacity_;
}

void arena_allocator::wait_for_frees() {
  for (auto& [off, b] : blocks_) {
    for (auto& d : b.deps) device_->synchronize_event(event{*static_cast<void**>(d.done.get())});
    b.deps.clear();
  }
}

void arena_allocator::set_budget(device_budget budget) {
  std::lock_guard lock(mutex_);
  SPILLWAY_EXPECTS_T(usage_error, stats_.allocated_bytes == 0,
                     "arena allocator: set_budget with " + format_bytes(stats_.allocated_bytes) +
                         " still allocated; free every block first");
  budget.check_fits(*device_);
  wait_for_frees();
  blocks_.clear();
  by_size_.clear();
  upstream_->deallocate(base_, capacity_, stream{});
  base_ = nullptr;
  const device_budget old = budget_;
  try {
    reserve(budget);
  } catch (const out_of_memory&) {
    reserve(old);  // the device had the old region a moment ago: keep the arena usable
    throw;
  }
}

void arena_allocator::index_free(std::size_t offset, std::size_t size) { by_size_.emplace(size, offset); }

void arena_allocator::unindex_free(std::size_t offset, std::size_t size) {
  auto [lo, hi] = by_size_.equal_range(size);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == offset) {
      by_size_.erase(it);
      return;
    }
  }
}

void arena_allocator::prune(std::vector<dependency>& deps) noexcept {
  // An event the device cannot answer for (it failed: its errors are sticky) stays: the bytes
  // are not known to be free of its work. Frees prune too, and a free must not throw.
  std::erase_if(deps, [&](const dependency& d) {
    try {
      return device_->query_event(event{*static_cast<void**>(d.done.get())});
    } catch (...) {
      return false;
    }
  });
}

std::vector<arena_allocator::dependency> arena_allocator::within(const std::vector<dependency>& deps, std::size_t lo,
                                                                 std::size_t hi) {
  std::vector<dependency> out;
  for (const auto& d : deps)
    if (d.lo < hi && lo < d.hi) out.push_back(d);
  return out;
}

void* arena_allocator::do_allocate(std::size_t bytes, stream s) {
  const std::size_t need = round_up(bytes, granule);
  std::lock_guard lock(mutex_);
  auto it = by_size_.lower_bound(need);
  if (it == by_size_.end()) {
    ++stats_.failures;
    const std::size_t largest = by_size_.empty() ? 0 : by_size_.rbegin()->first;
    throw out_of_memory("arena allocator: out of memory allocating " + format_bytes(bytes) + " (" +
                        std::to_string(bytes) + " bytes): budget " + format_bytes(budget_.bytes()) + ", allocated " +
                        format_bytes(stats_.allocated_bytes) + ", reserved " + format_bytes(capacity_) +
                        ", largest free block " + format_bytes(largest));
  }
  // Best fit, but among the few smallest blocks that fit, prefer one whose earlier users are done
  // (or on this stream): reusing it needs no wait.
  auto ready = [&](std::size_t off) {
    auto& deps = blocks_.at(off).deps;
    prune(deps);
    return std::all_of(deps.begin(), deps.end(),
                       [&](const dependency& d) { return d.stream == s.handle || d.hi <= off || off + need <= d.lo; });
  };
  auto pick = it;
  int looked = 0;
  for (auto c = it; c != by_size_.end() && looked < 8; ++c, ++looked) {
    if (ready(c->second)) {
      pick = c;
      break;
    }
  }
  it = pick;
  const std::size_t offset = it->second;
  by_size_.erase(it);
  return take(blocks_.find(offset), offset, need, s);
}

void* arena_allocator::try_allocate_at(std::size_t offset, std::size_t bytes, stream s) {
  const std::size_t need = round_up(bytes, granule);
  SPILLWAY_EXPECTS_T(usage_error, offset % granule == 0,
                     "arena allocator: try_allocate_at offset " + std::to_string(offset) + " is not a multiple of the " +
                         std::to_string(granule) + "-byte granule");
  std::lock_guard lock(mutex_);
  return allocate_at_locked(offset, need, s);
}

void* arena_allocator::try_allocate_high(std::size_t bytes, stream s) {
  const std::size_t need = round_up(bytes, granule);
  std::lock_guard lock(mutex_);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
    if (it->second.free && it->second.size >= need) return allocate_at_locked(it->first + it->second.size - need, need, s);
  return nullptr;
}

void* arena_allocator::allocate_at_locked(std::size_t offset, std::size_t need, stream s) {
  if (need == 0 || offset + need > capacity_) return nullptr;
  auto it = blocks_.upper_bound(offset);  // the block holding `offset` starts at or before it
  if (it == blocks_.begin()) return nullptr;
  --it;
  if (!it->second.free || it->first + it->second.size < offset + need) return nullptr;
  unindex_free(it->first, it->second.size);
  if (it->first < offset) {  // keep the free head as its own block, with the same dependencies
    const std::size_t head = offset - it->first;
    blocks_[offset] = block{it->second.size - head, true, within(it->second.deps, offset, it->first + it->second.size)};
    it->second.deps = within(it->second.deps, it->first, offset);
    it->second.size = head;
    index_free(it->first, head);
    it = blocks_.find(offset);
  }
  return take(it, offset, need, s);
}

// Hands the free block at `it` (already out of the size index) to stream `s`, its first `need`
// bytes; the tail stays free.
void* arena_allocator::take(std::map<std::size_t, block>::iterator it, std::size_t offset, std::size_t need, stream s) {
  auto& b = it->second;
  const std::size_t size = b.size;
  // Note [Arena handoff]: the new user waits for every earlier user that may not be done.
  prune(b.deps);
  try {
    for (auto& d : b.deps) {
      if (d.stream == s.handle) continue;  // same stream: stream order covers it
      if (d.hi <= offset || offset + need <= d.lo) continue;  // other bytes of the merged free block
      device_->stream_wait_event(s, event{*static_cast<void**>(d.done.get())});
      ++stats_.stream_handoffs;
    }
  } catch (...) {
    merge_and_index(it);  // the device refused a wait: the block stays free, as it was
    throw;
  }
  if (size > need) {  // split: the rest stays free with the same dependencies
    blocks_[offset + need] = block{size - need, true, within(b.deps, offset + need, offset + size)};
    index_free(offset + need, size - need);
  }
  b.size = need;
  b.free = false;
  b.deps.clear();
  stats_.allocated_bytes += need;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.allocations;
  return base_ + offset;
}

void arena_allocator::do_deallocate(void* ptr, std::size_t /*bytes*/, stream s) noexcept {
  std::lock_guard lock(mutex_);
  const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(ptr) - base_);
  auto it = blocks_.find(offset);
  if (it == blocks_.end() || it->second.free) std::abort();  // not a live block of this arena
  block& b = it->second;
  stats_.allocated_bytes -= b.size;
  b.free = true;
  if (s.handle != nullptr) {
    try {
      event e = events_->take();
      auto holder = std::shared_ptr<void>(new void*(e.handle), [pool = events_](void* p) {
        auto* h = static_cast<void**>(p);
        pool->give(event{*h});
        delete h;
      });
      device_->record_event(e, s);
      b.deps.push_back(dependency{s.handle, std::move(holder), offset, offset + b.size});
    } catch (...) {
      // No event could be recorded: wait for the stream instead, so the block is safe for all.
      try {
        device_->synchronize_stream(s);
      } catch (...) {  // NOLINT(bugprone-empty-catch): the stream's own error surfaces at its next synchronize
      }
    }
  }
  merge_and_index(it);
}

// Merges the free block at `it` (out of the size index) with its free neighbours and indexes the
// result; the merged block keeps every part's dependencies.
void arena_allocator::merge_and_index(std::map<std::size_t, block>::iterator it) {
  block& b = it->second;
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.free) {
    unindex_free(next->first, next->second.size);
    b.size += next->second.size;
    b.deps.insert(b.deps.end(), next->second.deps.begin(), next->second.deps.end());
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free) {
      unindex_free(prev->first, prev->second.size);
      prev->second.size += b.size;
      prev->second.deps.insert(prev->second.deps.end(), b.deps.begin(), b.deps.end());
      blocks_.erase(it);
      it = prev;
    }
  }
  if (it->second.deps.size() > 8) prune(it->second.deps);
  index_free(it->first, it->second.size);
}

arena_stats arena_allocator::stats() const {
  std::lock_guard lock(mutex_);
  arena_stats s = stats_;
  s.largest_free_bytes = by_size_.empty() ? 0 : by_size_.rbegin()->first;
  return s;
}

void arena_allocator::forget_stream(stream s) {
  std::lock_guard lock(mutex_);
  bool used = false;
  for (auto& [off, b] : blocks_)
    for (auto& d : b.deps) used = used || d.stream == s.handle;
  if (!used) return;
  device_->synchronize_stream(s);
  for (auto& [off, b] : blocks_) std::erase_if(b.deps, [&](const dependency& d) { return d.stream == s.handle; });
}

}  // namespace spillway
