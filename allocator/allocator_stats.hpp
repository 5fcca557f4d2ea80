// Statistics of an allocator, PyTorch style: a plain struct whose fields say what they count.
// Every `stat` holds current, peak, and the running totals added and removed.
#pragma once

#include <algorithm>
#include <cstdint>

namespace spillway {

/// One counter. SUM (bytes) or COUNT (blocks), as its field says.
struct stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  ///< total ever added
  std::int64_t freed = 0;      ///< total ever removed

  void increase(std::int64_t n) noexcept {
    current += n;
    allocated += n;
    peak = std::max(peak, current);
  }
  void decrease(std::int64_t n) noexcept {
    current -= n;
    freed += n;
  }
  /// Peak back to current (the running totals stay).
  void reset_peak() noexcept { peak = current; }
};

struct allocator_stats {
  stat allocated_bytes;       ///< SUM of bytes of live blocks (after rounding, with unsplit slack)
  stat requested_bytes;       ///< SUM of bytes asked for by live blocks
  stat reserved_bytes;        ///< SUM of bytes of segments taken from upstream
  stat allocation_count;      ///< COUNT of live blocks
  stat segment_count;         ///< COUNT of segments
  std::uint64_t num_alloc_retries = 0;    ///< COUNT of times cached segments were released to retry
  std::uint64_t num_ooms = 0;             ///< COUNT of out_of_memory thrown
  std::uint64_t num_stream_handoffs = 0;  ///< COUNT of events recorded to hand blocks to other streams
  std::uint64_t num_segment_releases = 0; ///< COUNT of segments given back upstream
};

}  // namespace spillway
