// Host tier: capacity accounting over the pinned host pool, and an out-of-memory message
// that says what was asked, what is held and what is free.
#include "swap/host_tier.hpp"

#include <algorithm>

#include "allocator/pinned_host_pool.hpp"
#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway {

host_tier::host_tier(pinned_host_pool& pool, std::size_t capacity) : pool_(pool), capacity_(capacity) {
  stats_.capacity_bytes = capacity;
}

std::size_t host_tier::footprint(std::size_t bytes) const noexcept {
  const std::size_t a = pool_.options().alignment;
  return round_up(bytes, a);  // 0 stays 0
}

void* host_tier::allocate(const std::string& name, std::size_t bytes) {
  const std::size_t need = footprint(bytes);
  if (need == 0) return nullptr;
  std::string why;
  bool counted = false;
  {
    // The bytes are counted first and the block taken from the pool outside the lock: the pool
    // may pin a region (slow on a GPU), and frees from other threads (the NVMe ring's, the
    // event worker's) need not wait for it (Note [Pinning outside the lock] in
    // allocator/pinned_host_pool.cpp).
    std::lock_guard lock(mutex_);
    if (capacity_ == 0 || need <= capacity_ - std::min(capacity_, stats_.used_bytes)) {
      stats_.used_bytes += need;
      ++stats_.blocks;
      counted = true;
    } else {
      why = "; the tier's capacity is reached";
    }
  }
  if (counted) {
    try {
      void* p = pool_.allocate(bytes);
      std::lock_guard lock(mutex_);
      stats_.peak_used_bytes = std::max(stats_.peak_used_bytes, stats_.used_bytes);
      return p;
    } catch (const out_of_memory& e) {
      why = std::string("; the pinned host pool is full: ") + e.what();
    } catch (...) {
      std::lock_guard lock(mutex_);
      stats_.used_bytes -= need;
      --stats_.blocks;
      throw;
    }
    std::lock_guard lock(mutex_);
    stats_.used_bytes -= need;
    --stats_.blocks;
  }
  const auto s = stats();
  const auto ps = pool_.stats();
  throw out_of_memory("host tier: out of memory storing tensor '" + name + "' (" + format_bytes(bytes) +
                      "): capacity " + (capacity_ == 0 ? std::string("unlimited") : format_bytes(capacity_)) +
                      ", used " + format_bytes(s.used_bytes) + ", free " +
                      (capacity_ == 0 ? std::string("-") : format_bytes(capacity_ - std::min(capacity_, s.used_bytes))) +
                      ", pool reserved " + format_bytes(ps.reserved_bytes) + ", pool largest free block " +
                      format_bytes(pool_.largest_free_block()) + why);
}

void host_tier::deallocate(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  pool_.deallocate(ptr, bytes);
  std::lock_guard lock(mutex_);
  stats_.used_bytes -= std::min(stats_.used_bytes, footprint(bytes));
  --stats_.blocks;
}

host_tier_stats host_tier::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace spillway
