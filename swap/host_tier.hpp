// Host tier: tensor bytes in pinned host memory (blocks of the pinned host pool), with a
// capacity of its own so that the host tier cannot take all the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace spillway {

class pinned_host_pool;

struct host_tier_stats {
  std::size_t capacity_bytes = 0;  ///< the tier's capacity
  std::size_t used_bytes = 0;      ///< SUM of bytes of live blocks, as the pool rounds them
  std::size_t peak_used_bytes = 0;
  std::uint64_t blocks = 0;        ///< COUNT of live blocks
};

/// Thread-safe. Blocks are pinned, aligned to the pool's alignment (4 KiB by default) and
/// rounded up to it, so the NVMe tier can do O_DIRECT I/O straight from them.
class host_tier {
 public:
  /// `capacity`: most bytes (after the pool's rounding) the tier holds at once; 0 = the pool's
  /// own capacity only.
  host_tier(pinned_host_pool& pool, std::size_t capacity);

  /// A block of `bytes` for tensor `name`. Throws out_of_memory with a diagnosis (tensor,
  /// requested, capacity, used, free, the pool's reserved bytes and largest free block).
  [[nodiscard]] void* allocate(const std::string& name, std::size_t bytes);
  /// Returns a block; `bytes` as given to allocate().
  void deallocate(void* ptr, std::size_t bytes) noexcept;

  /// Bytes a block of `bytes` really takes (the pool's rounding).
  [[nodiscard]] std::size_t footprint(std::size_t bytes) const noexcept;
  [[nodiscard]] host_tier_stats stats() const;
  [[nodiscard]] pinned_host_pool& pool() const noexcept { return pool_; }

 private:
  pinned_host_pool& pool_;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  host_tier_stats stats_;
};

}  // namespace spillway
