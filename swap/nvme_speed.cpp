#include "swap/nvme_speed.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "allocator/pinned_host_pool.hpp"
#include "device/units.hpp"

namespace spillway {

nvme_speed measure_speed(nvme_tier& tier, pinned_host_pool& pool, std::size_t bytes) {
  const auto stats = tier.stats();
  const std::size_t stripe = std::size_t{tier.options().block_size} * std::max<std::size_t>(1, tier.options().directories.size());
  // Whole stripes only, so that every file's share is whole blocks and fits its free space.
  // The file with the least free space sets how many stripes fit (after a partial grow the
  // files' free space differs, and each file takes one block of every stripe).
  std::size_t free_stripes = stats.free_bytes / stripe;
  if (!stats.free_bytes_per_file.empty()) {
    const auto least = *std::min_element(stats.free_bytes_per_file.begin(), stats.free_bytes_per_file.end());
    free_stripes = std::min<std::size_t>(free_stripes, least / tier.options().block_size);
  }
  const std::size_t n = std::min(bytes / stripe, free_stripes) * stripe;
  nvme_speed out;
  if (n == 0) return out;
  const std::size_t capacity = round_up(n, tier.alignment());
  void* buf = pool.allocate(capacity);
  const std::string name = "spillway nvme speed test";
  try {
    std::memset(buf, 0x5a, capacity);
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    tier.write(name, buf, n, capacity).wait();
    const double write_s = std::chrono::duration<double>(clock::now() - t0).count();
    t0 = clock::now();
    tier.read(name, buf, capacity).wait();
    const double read_s = std::chrono::duration<double>(clock::now() - t0).count();
    tier.erase(name);
    out.bytes = n;
    out.write_bytes_per_s = static_cast<double>(n) / std::max(write_s, 1e-9);
    out.read_bytes_per_s = static_cast<double>(n) / std::max(read_s, 1e-9);
  } catch (...) {
    if (tier.contains(name)) tier.erase(name);
    // A read that timed out may still land in the buffer: it goes back once the kernel is done.
    tier.after_settled(buf, [&pool, buf, capacity] { pool.deallocate(buf, capacity); });
    throw;
  }
  pool.deallocate(buf, capacity);
  return out;
}

}  // namespace spillway
