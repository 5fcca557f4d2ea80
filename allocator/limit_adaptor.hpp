// Limit adaptor: refuses allocations that would take the bytes in use through it past a limit.
// The limit is checked and reserved atomically; a refused or failed allocation rolls back.
#pragma once

#include <atomic>
#include <cstddef>

#include "allocator/memory_resource.hpp"

namespace spillway {

class limit_adaptor final : public device_memory_resource {
 public:
  /// A limit of 0 or above max_size_bytes is a config_error.
  limit_adaptor(device_memory_resource& upstream, std::size_t limit);
  [[nodiscard]] const char* name() const noexcept override { return "limit adaptor"; }
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }

 private:
  void* do_allocate(std::size_t bytes, stream s) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept override;

  device_memory_resource* upstream_;
  std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace spillway
