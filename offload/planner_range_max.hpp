// Range-add, range-max tree over per-op byte counts: lets the planners move a prefetch back to
// the earliest op memory allows, or test a stretch of ops, in logarithmic time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace spillway::offload::detail {

/// Values v[0..n); add a constant to a range, ask the largest value of a range, or the last
/// index of a range whose value exceeds a limit. Each node keeps the max of its subtree plus
/// its own pending add (adds are never pushed down).
class range_max {
 public:
  explicit range_max(const std::vector<std::int64_t>& v) : n_(v.size()) {
    size_ = 1;
    while (size_ < std::max<std::size_t>(n_, 1)) size_ *= 2;
    mx_.assign(2 * size_, lowest);
    tag_.assign(2 * size_, 0);
    for (std::size_t i = 0; i < n_; ++i) mx_[size_ + i] = v[i];
    for (std::size_t i = size_ - 1; i > 0; --i) mx_[i] = std::max(mx_[2 * i], mx_[2 * i + 1]);
  }

  /// v[i] += d for i in [lo, hi).
  void add(std::size_t lo, std::size_t hi, std::int64_t d) {
    if (lo < hi) add(1, 0, size_, lo, hi, d);
  }
  /// max v[i] for i in [lo, hi); the lowest value when the range is empty.
  [[nodiscard]] std::int64_t max(std::size_t lo, std::size_t hi) const {
    return lo < hi ? max(1, 0, size_, lo, hi) : lowest;
  }
  /// The largest i in [lo, hi) with v[i] > limit, or -1.
  [[nodiscard]] std::int64_t last_above(std::size_t lo, std::size_t hi, std::int64_t limit) const {
    return lo < hi ? last_above(1, 0, size_, lo, hi, limit) : -1;
  }

 private:
  static constexpr std::int64_t lowest = std::numeric_limits<std::int64_t>::min() / 4;

  void add(std::size_t node, std::size_t nl, std::size_t nr, std::size_t lo, std::size_t hi, std::int64_t d) {
    if (hi <= nl || nr <= lo) return;
    if (lo <= nl && nr <= hi) {
      mx_[node] += d;
      tag_[node] += d;
      return;
    }
    const std::size_t mid = (nl + nr) / 2;
    add(2 * node, nl, mid, lo, hi, d);
    add(2 * node + 1, mid, nr, lo, hi, d);
    mx_[node] = std::max(mx_[2 * node], mx_[2 * node + 1]) + tag_[node];
  }
  std::int64_t max(std::size_t node, std::size_t nl, std::size_t nr, std::size_t lo, std::size_t hi) const {
    if (hi <= nl || nr <= lo) return lowest;
    if (lo <= nl && nr <= hi) return mx_[node];
    const std::size_t mid = (nl + nr) / 2;
    return std::max(max(2 * node, nl, mid, lo, hi), max(2 * node + 1, mid, nr, lo, hi)) + tag_[node];
  }
  // `limit` is already lowered by the adds of the node's ancestors.
  std::int64_t last_above(std::size_t node, std::size_t nl, std::size_t nr, std::size_t lo, std::size_t hi,
                          std::int64_t limit) const {
    if (hi <= nl || nr <= lo || mx_[node] <= limit) return -1;
    if (nr - nl == 1) return static_cast<std::int64_t>(nl);
    const std::size_t mid = (nl + nr) / 2;
    const auto r = last_above(2 * node + 1, mid, nr, lo, hi, limit - tag_[node]);
    return r >= 0 ? r : last_above(2 * node, nl, mid, lo, hi, limit - tag_[node]);
  }

  std::size_t n_, size_;
  std::vector<std::int64_t> mx_, tag_;
};

}  // namespace spillway::offload::detail
