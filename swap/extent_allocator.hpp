// Extent allocator: hands out runs of blocks of one swap file, first fit, merging on free.
// An *extent* is a run of whole blocks [first, first + count) inside one file.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace spillway {

struct extent {
  std::uint64_t first = 0;  ///< first block
  std::uint64_t count = 0;  ///< blocks
  friend bool operator==(const extent&, const extent&) = default;
};

/// Not thread-safe: the NVMe tier calls it under its own lock.
class extent_allocator {
 public:
  explicit extent_allocator(std::uint64_t blocks);

  /// `count` blocks as few extents as the free space allows (one when a run is long enough),
  /// or an empty vector when fewer than `count` blocks are free (nothing is taken then).
  [[nodiscard]] std::vector<extent> allocate(std::uint64_t count);
  /// Returns an extent; merges it with free neighbours.
  void deallocate(extent e);
  /// Adds `blocks` free blocks after the last one (the file grew); merges with a free tail.
  void grow(std::uint64_t blocks);

  [[nodiscard]] std::uint64_t total_blocks() const noexcept { return total_; }
  [[nodiscard]] std::uint64_t free_blocks() const noexcept { return free_; }
  [[nodiscard]] std::uint64_t largest_free_extent() const noexcept;
  [[nodiscard]] std::size_t free_extents() const noexcept { return free_list_.size(); }

 private:
  std::uint64_t total_;
  std::uint64_t free_;
  std::map<std::uint64_t, std::uint64_t> free_list_;  // first block -> count
};

}  // namespace spillway
