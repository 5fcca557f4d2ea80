// Extent allocator: first fit over a free list ordered by block, with merging of neighbours.
// A request too large for any one run is met by several runs, lowest blocks first.
#include "swap/extent_allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>

namespace spillway {

extent_allocator::extent_allocator(std::uint64_t blocks) : total_(blocks), free_(blocks) {
  if (blocks > 0) free_list_.emplace(0, blocks);
}

std::vector<extent> extent_allocator::allocate(std::uint64_t count) {
  std::vector<extent> out;
  if (count == 0 || count > free_) return out;
  // One run when some free run is long enough (first fit keeps low blocks busy, high ones free).
  for (auto it = free_list_.begin(); it != free_list_.end(); ++it) {
    if (it->second < count) continue;
    out.push_back({it->first, count});
    const auto rest_first = it->first + count;
    const auto rest_count = it->second - count;
    free_list_.erase(it);
    if (rest_count > 0) free_list_.emplace(rest_first, rest_count);
    free_ -= count;
    return out;
  }
  // Fragmented: take runs from the start until the request is met.
  std::uint64_t need = count;
  auto it = free_list_.begin();
  while (need > 0) {  // free_ >= count guarantees the list holds enough
    const auto take = std::min(need, it->second);
    out.push_back({it->first, take});
    need -= take;
    if (take == it->second) {
      it = free_list_.erase(it);
    } else {
      const auto rest_first = it->first + take;
      const auto rest_count = it->second - take;
      free_list_.erase(it);
      free_list_.emplace(rest_first, rest_count);
    }
  }
  free_ -= count;
  return out;
}

void extent_allocator::deallocate(extent e) {
  if (e.count == 0) return;
  if (e.first + e.count > total_) std::abort();  // an extent this allocator never gave out
  auto next = free_list_.lower_bound(e.first);
  if (next != free_list_.end() && next->first < e.first + e.count) std::abort();  // double free
  std::uint64_t first = e.first;
  std::uint64_t count = e.count;
  if (next != free_list_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > e.first) std::abort();  // double free
    if (prev->first + prev->second == e.first) {
      first = prev->first;
      count += prev->second;
      free_list_.erase(prev);
    }
  }
  if (next != free_list_.end() && next->first == e.first + e.count) {
    count += next->second;
    free_list_.erase(next);
  }
  free_list_.emplace(first, count);
  free_ += e.count;
}

void extent_allocator::grow(std::uint64_t blocks) {
  if (blocks == 0) return;
  const std::uint64_t first = total_;
  total_ += blocks;
  deallocate({first, blocks});  // merges with a free run that ends at the old end
}

std::uint64_t extent_allocator::largest_free_extent() const noexcept {
  std::uint64_t best = 0;
  for (const auto& [first, count] : free_list_) best = std::max(best, count);
  return best;
}

}  // namespace spillway
