// Statistics adaptor: atomic counters around an upstream resource, rolled back on failure.
// Peaks are raised with a compare-exchange loop so concurrent callers never lower them.
#include "allocator/statistics_adaptor.hpp"

namespace spillway {

namespace {
void raise(std::atomic<std::int64_t>& peak, std::int64_t value) noexcept {
  std::int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

void* statistics_adaptor::do_allocate(std::size_t bytes, stream s) {
  const auto n = static_cast<std::int64_t>(bytes);
  raise(peak_bytes_, bytes_.fetch_add(n, std::memory_order_relaxed) + n);
  raise(peak_count_, count_.fetch_add(1, std::memory_order_relaxed) + 1);
  try {
    void* p = upstream_->allocate(bytes, s);
    total_bytes_.fetch_add(n, std::memory_order_relaxed);
    total_count_.fetch_add(1, std::memory_order_relaxed);
    return p;
  } catch (...) {
    bytes_.fetch_sub(n, std::memory_order_relaxed);
    count_.fetch_sub(1, std::memory_order_relaxed);
    throw;
  }
}

void statistics_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept {
  upstream_->deallocate(ptr, bytes, s);
  bytes_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  count_.fetch_sub(1, std::memory_order_relaxed);
}

statistics_adaptor::counters statistics_adaptor::stats() const noexcept {
  counters c;
  c.current_bytes = bytes_.load(std::memory_order_relaxed);
  c.peak_bytes = peak_bytes_.load(std::memory_order_relaxed);
  c.total_bytes = total_bytes_.load(std::memory_order_relaxed);
  c.current_count = count_.load(std::memory_order_relaxed);
  c.peak_count = peak_count_.load(std::memory_order_relaxed);
  c.total_count = total_count_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace spillway
