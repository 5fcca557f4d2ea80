// Limit adaptor: a hard cap on the bytes in use through one upstream resource.
// Bytes are counted as requested, rounded up to the 256-byte device alignment.
#include "allocator/limit_adaptor.hpp"

#include <string>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway {

namespace {
std::size_t charged(std::size_t bytes) {
  return round_up(bytes, device_memory_alignment);
}
}  // namespace

limit_adaptor::limit_adaptor(device_memory_resource& upstream, std::size_t limit) : upstream_(&upstream), limit_(limit) {
  if (limit == 0 || limit > max_size_bytes) {
    throw config_error("limit adaptor: the limit must be between 1 B and " + format_bytes(max_size_bytes) + ", got " +
                       std::to_string(limit) + " bytes");
  }
}

void* limit_adaptor::do_allocate(std::size_t bytes, stream s) {
  const std::size_t n = charged(bytes);
  std::size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (n > limit_ || used > limit_ - n) {
      throw out_of_memory("limit adaptor: out of memory allocating " + format_bytes(bytes) + " (" +
                          std::to_string(bytes) + " bytes): limit " + format_bytes(limit_) + ", in use " +
                          format_bytes(used));
    }
  } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
  try {
    return upstream_->allocate(bytes, s);
  } catch (...) {
    used_.fetch_sub(n, std::memory_order_relaxed);
    throw;
  }
}

void limit_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept {
  upstream_->deallocate(ptr, bytes, s);
  used_.fetch_sub(charged(bytes), std::memory_order_relaxed);
}

}  // namespace spillway
