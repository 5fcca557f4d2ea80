// The device caching allocator: stream ordering, budget, retry and statistics around the pools.
// The free-list policy itself lives in block_pool.cpp; see Note [Stream reuse] below.
#include "allocator/caching_allocator.hpp"

#include <algorithm>
#include <cassert>

#include "allocator/device_resource.hpp"
#include "device/error.hpp"
#include "device/log.hpp"
#include "device/units.hpp"

namespace spillway {

// Note [Stream reuse]
// A block freed on stream s (the stream of last use) may still be read or written by work
// queued on s. Handing it to s again is safe at once: s runs in order. Handing it to another
// stream t is safe only once that work has finished, which an event recorded on s after the
// free shows. Recording an event on every free would put a device call on the fast path, so
// events are recorded lazily, one per stream for a whole batch of frees: a freed block stays
// "free on s" (reusable only by s) until a request on t finds nothing usable; then the blocks
// free on the other streams are moved to pending behind one event per stream (a "handoff").
// When its event is finished, a pending block becomes free on any stream. An event recorded
// later than the free covers the free too, so a late event is only conservative, never wrong.
// Before growing past the budget or giving up, the allocator waits for every pending event.
//
// Note [Budget and retry]
// Reserved bytes (every segment taken from upstream) never exceed the budget. A request that
// finds no free block asks upstream for a new segment if it fits the budget; if it does not
// (or upstream refuses), the allocator waits for the handoffs, gives every fully free segment
// back upstream and tries once more ("retry", counted in num_alloc_retries) before throwing
// out_of_memory with a diagnosis: requested, budget, allocated, reserved, cached, largest free
// block, and what the device reports.

// Note [Stale segments]
// Before the large pool grows, its segments that are wholly free (on any stream, or on the
// requesting stream) go back upstream: best fit found no block for the request, so none of
// them can serve it, and after a change of shapes (another batch size) they would stay reserved
// for sizes that no longer come. In a steady training loop every request is served from cache,
// so this runs only while the pattern changes. (The cuda backend's cudaFree is slow; paying it
// at shape changes keeps the reserved peak close to the allocated peak, which is what lets a
// budget-bound executor use the memory.) The small pool keeps its 2 MiB segments.

namespace {
constexpr std::size_t min_block = 512;
constexpr std::size_t small_size = 1 << 20;      // requests up to this use the small pool
constexpr std::size_t small_segment = 2 << 20;   // segment size of the small pool
constexpr std::size_t large_segment = 20 << 20;  // segment size for large requests under min_large_alone
constexpr std::size_t min_large_alone = 10 << 20;
constexpr std::size_t large_rounding = 2 << 20;

std::size_t checked_budget(const Device& device, std::size_t budget) {
  const std::size_t total = device.properties().total_memory;
  if (budget == 0) return total;
  if (budget > total) {
    throw config_error("caching allocator: budget " + format_bytes(budget) + " (" + std::to_string(budget) +
                       " bytes) is larger than the device's total memory of " + format_bytes(total) + " (" +
                       std::to_string(total) + " bytes)");
  }
  return budget;
}
}  // namespace

caching_allocator::caching_allocator(Device& device, caching_allocator_options options)
    : caching_allocator(device, std::make_unique<device_resource>(device), options) {}

// The upstream is a parameter while the other constructor runs, so a bad budget (which throws
// there) does not leak it.
caching_allocator::caching_allocator(Device& device, std::unique_ptr<device_memory_resource> upstream,
                                     caching_allocator_options options)
    : caching_allocator(device, *upstream, options) {
  owned_upstream_ = std::move(upstream);
}

caching_allocator::caching_allocator(Device& device, device_memory_resource& upstream,
                                     caching_allocator_options options)
    : device_(&device),
      device_total_(device.properties().total_memory),
      upstream_(&upstream),
      budget_(checked_budget(device, options.budget)),
      small_(min_block),
      large_(small_size + 1) {}

caching_allocator::~caching_allocator() {
  std::lock_guard lock(mutex_);
  try {
    wait_for_all_streams();
  } catch (const std::exception& e) {
    log(log_level::error, std::string("caching allocator: waiting for streams at destruction failed: ") + e.what());
  }
  if (!live_.empty()) {
    log(log_level::warning, "caching allocator destroyed with " + std::to_string(live_.size()) + " live blocks (" +
                                format_bytes(allocated_bytes()) + "); their memory is released now");
  }
  for (auto* pool : {&small_, &large_}) {
    for (const detail::segment* seg : pool->segments())
      upstream_->deallocate(reinterpret_cast<void*>(seg->address), seg->size, stream{});
  }
  for (event e : spare_events_) device_->destroy_event(e);
}

event caching_allocator::take_event() {
  if (spare_events_.empty()) return device_->create_event();
  event e = spare_events_.back();
  spare_events_.pop_back();
  return e;
}

void* caching_allocator::do_allocate(std::size_t bytes, stream s) {
  if (bytes > device_total_) [[unlikely]] throw_larger_than_device(bytes);
  const std::size_t rounded = round_up(bytes, min_block);
  const bool small = rounded <= small_size;
  auto& pool = small ? small_ : large_;

  std::lock_guard lock(mutex_);
  detail::block* b = find_block(pool, rounded, s.handle);
  if (b == nullptr && grow(pool, small, rounded, s.handle)) b = pool.best_fit(s.handle, rounded);
  if (b == nullptr) {  // Note [Budget and retry]
    ++stats_.num_alloc_retries;
    wait_for_all_streams();
    b = pool.best_fit(s.handle, rounded);
    if (b == nullptr) {
      release_cached();
      if (grow(pool, small, rounded, s.handle)) b = pool.best_fit(s.handle, rounded);
    }
  }
  if (b == nullptr) throw_out_of_memory(bytes, rounded, "no cached block fits and the budget or device has no room");

  b = pool.take(b, rounded, bytes, s.handle);
  void* ptr = reinterpret_cast<void*>(b->address);
  live_.insert(b->address, b);
  stats_.allocated_bytes.increase(static_cast<std::int64_t>(b->size));
  stats_.requested_bytes.increase(static_cast<std::int64_t>(bytes));
  stats_.allocation_count.increase(1);
  allocated_.fetch_add(b->size, std::memory_order_relaxed);
  return ptr;
}

void caching_allocator::do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept {
  std::lock_guard lock(mutex_);
  detail::block* b = live_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  assert(b != nullptr && "caching allocator: freeing a pointer it did not hand out");
  if (b == nullptr) return;
  assert(b->requested == bytes && "caching allocator: deallocate size differs from allocate size");
  (void)bytes;
  stats_.allocated_bytes.decrease(static_cast<std::int64_t>(b->size));
  stats_.requested_bytes.decrease(static_cast<std::int64_t>(b->requested));
  stats_.allocation_count.decrease(1);
  allocated_.fetch_sub(b->size, std::memory_order_relaxed);
  b->seg->pool->release(b, s.handle);
}

detail::block* caching_allocator::find_block(detail::block_pool& pool, std::size_t size, void* s) {
  if (detail::block* b = pool.best_fit(s, size)) return b;
  if (!handoffs_.empty()) {
    settle_finished_handoffs();
    if (detail::block* b = pool.best_fit(s, size)) return b;
  }
  if (pool.others_hold(s, size)) {  // Note [Stream reuse]: hand the other streams' blocks over
    for (void* other : pool.owning_streams())
      if (other != s) hand_over(pool, other);
    settle_finished_handoffs();
    return pool.best_fit(s, size);
  }
  return nullptr;
}

bool caching_allocator::grow(detail::block_pool& pool, bool small, std::size_t size, void* s) {
  const std::size_t budget = budget_.load(std::memory_order_relaxed);
  const std::size_t reserved = reserved_.load(std::memory_order_relaxed);
  std::size_t bytes = small ? small_segment : size < min_large_alone ? large_segment : round_up(size, large_rounding);
  if (reserved + bytes > budget) bytes = small ? size : round_up(size, large_rounding);
  if (reserved + bytes > budget) bytes = size;
  if (reserved + bytes > budget) return false;
  // Note [Stale segments]: large segments that are wholly free could not serve this request.
  if (!small) release_free_segments(pool, s);
  void* p = nullptr;
  try {
    p = upstream_->allocate(bytes, stream{s});
  } catch (const out_of_memory&) {
    return false;
  }
  pool.add_segment(reinterpret_cast<std::uintptr_t>(p), bytes, s);
  reserved_.fetch_add(bytes, std::memory_order_relaxed);
  stats_.reserved_bytes.increase(static_cast<std::int64_t>(bytes));
  stats_.segment_count.increase(1);
  return true;
}

void caching_allocator::hand_over(detail::block_pool& pool, void* s) {
  handoff h{take_event(), &pool, {}};
  pool.make_pending(s, h.blocks);
  if (h.blocks.empty()) {
    spare_events_.push_back(h.done);
    return;
  }
  try {
    device_->record_event(h.done, stream{s});
  } catch (...) {
    for (detail::block* b : h.blocks) pool.release(b, s);  // back to free on s; nothing changed
    spare_events_.push_back(h.done);
    throw;
  }
  ++stats_.num_stream_handoffs;
  handoffs_.push_back(std::move(h));
}

void caching_allocator::settle_finished_handoffs() {
  std::erase_if(handoffs_, [&](handoff& h) {
    if (!device_->query_event(h.done)) return false;
    for (detail::block* b : h.blocks) h.pool->settle(b);
    spare_events_.push_back(h.done);
    return true;
  });
}

void caching_allocator::wait_for_all_streams() {
  for (auto* pool : {&small_, &large_}) {
    for (void* s : pool->owning_streams()) hand_over(*pool, s);
  }
  for (auto& h : handoffs_) device_->synchronize_event(h.done);
  settle_finished_handoffs();
}

std::size_t caching_allocator::release_cached() { return release_free_segments(small_, nullptr) + release_free_segments(large_, nullptr); }

std::size_t caching_allocator::release_free_segments(detail::block_pool& pool, void* also) {
  std::size_t released = 0;
  {
    for (const auto& seg : pool.remove_free_segments(also)) {
      // The segment is one free block: on any stream (no device work uses it) or on `also`,
      // whose work upstream waits for (the stream contract).
      upstream_->deallocate(reinterpret_cast<void*>(seg.address), seg.size, stream{seg.free_on});
      reserved_.fetch_sub(seg.size, std::memory_order_relaxed);
      stats_.reserved_bytes.decrease(static_cast<std::int64_t>(seg.size));
      stats_.segment_count.decrease(1);
      ++stats_.num_segment_releases;
      released += seg.size;
    }
  }
  return released;
}

std::size_t caching_allocator::empty_cache() {
  std::lock_guard lock(mutex_);
  wait_for_all_streams();
  return release_cached();
}

void caching_allocator::forget_stream(stream s) {
  if (s.handle == nullptr) return;
  std::lock_guard lock(mutex_);
  hand_over(small_, s.handle);
  hand_over(large_, s.handle);
  for (auto& h : handoffs_) device_->synchronize_event(h.done);
  settle_finished_handoffs();
}

void caching_allocator::set_budget(std::size_t bytes) {
  if (bytes == 0) throw config_error("caching allocator: a budget of 0 bytes cannot hold anything");
  const std::size_t checked = checked_budget(*device_, bytes);
  std::lock_guard lock(mutex_);
  budget_.store(checked, std::memory_order_relaxed);
  if (reserved_.load(std::memory_order_relaxed) > checked) {
    wait_for_all_streams();
    release_cached();
  }
}

void caching_allocator::throw_larger_than_device(std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.num_ooms;
  }
  throw out_of_memory("caching allocator: cannot allocate " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                      " bytes): more than the device's total memory of " + format_bytes(device_total_));
}

void caching_allocator::throw_out_of_memory(std::size_t bytes, std::size_t rounded, const std::string& why) {
  ++stats_.num_ooms;
  std::string device_state;
  try {
    device_state = "; the device has " + format_bytes(device_->properties().total_memory) + " in total, " +
                   format_bytes(device_->used_memory()) + " in use";
  } catch (const std::exception&) {
    device_state = "";
  }
  throw out_of_memory("caching allocator: out of memory allocating " + format_bytes(bytes) + " (" +
                      std::to_string(bytes) + " bytes, " + format_bytes(rounded) + " after rounding): " + why +
                      ". Budget " + format_bytes(budget()) + ", allocated " + format_bytes(allocated_bytes()) +
                      ", reserved " + format_bytes(reserved_bytes()) + ", free in cache " +
                      format_bytes(small_.free_bytes() + large_.free_bytes()) + ", largest free block " +
                      format_bytes(std::max(small_.largest_free(), large_.largest_free())) + device_state);
}

allocator_stats caching_allocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void caching_allocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  for (stat* s : {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.reserved_bytes, &stats_.allocation_count,
                  &stats_.segment_count})
    s->reset_peak();
}

std::vector<segment_info> caching_allocator::segments() const {
  std::lock_guard lock(mutex_);
  std::vector<segment_info> out;
  for (const auto* pool : {&small_, &large_}) {
    for (const detail::segment* seg : pool->segments()) {
      segment_info si;
      si.address = seg->address;
      si.total_size = seg->size;
      si.stream = seg->stream;
      si.segment_type = pool == &small_ ? "small" : "large";
      for (const detail::block* b = seg->first; b != nullptr; b = b->next) {
        block_info bi{b->address, b->size, b->requested, "inactive", b->stream};
        if (b->state == detail::block_state::live) {
          bi.state = "active_allocated";
          si.allocated_size += b->size;
          si.requested_size += b->requested;
        } else if (b->state == detail::block_state::pending) {
          bi.state = "active_pending_free";
        }
        si.blocks.push_back(bi);
      }
      out.push_back(std::move(si));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return out;
}

void caching_allocator::check_invariants() const {
  std::lock_guard lock(mutex_);
  small_.check_invariants();
  large_.check_invariants();
  std::size_t reserved = 0, segments = 0;
  for (const auto* pool : {&small_, &large_}) {
    for (const detail::segment* seg : pool->segments()) reserved += seg->size;
    segments += pool->segments().size();
  }
  std::size_t allocated = 0;
  bool wrong = false;
  live_.for_each([&](std::uintptr_t address, const detail::block* b) {
    wrong = wrong || b->state != detail::block_state::live || b->address != address;
    allocated += b->size;
  });
  if (wrong) throw error("caching allocator invariant broken: a live pointer's block is not live");
  if (reserved != reserved_bytes() || static_cast<std::int64_t>(reserved) != stats_.reserved_bytes.current ||
      static_cast<std::int64_t>(segments) != stats_.segment_count.current)
    throw error("caching allocator invariant broken: reserved bytes disagree with the segments");
  if (allocated != allocated_bytes() || static_cast<std::int64_t>(allocated) != stats_.allocated_bytes.current)
    throw error("caching allocator invariant broken: allocated bytes disagree with the live blocks");
  if (reserved > budget()) throw error("caching allocator invariant broken: reserved bytes exceed the budget");
}

}  // namespace spillway
