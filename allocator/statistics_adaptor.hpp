// Statistics adaptor: counts bytes and allocations passing through any upstream resource.
// Counters are atomics; an allocation the upstream refuses is rolled back.
#pragma once

#include <atomic>
#include <cstdint>

#include "allocator/memory_resource.hpp"

namespace spillway {

class statistics_adaptor final : public device_memory_resource {
 public:
  struct counters {
    std::int64_t current_bytes = 0, peak_bytes = 0, total_bytes = 0;  ///< SUM
    std::int64_t current_count = 0, peak_count = 0, total_count = 0;  ///< COUNT
  };

  explicit statistics_adaptor(device_memory_resource& upstream) : upstream_(&upstream) {}
  [[nodiscard]] const char* name() const noexcept override { return "statistics adaptor"; }
  [[nodiscard]] counters stats() const noexcept;
  [[nodiscard]] device_memory_resource& upstream() const noexcept { return *upstream_; }

 private:
  void* do_allocate(std::size_t bytes, stream s) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept override;

  device_memory_resource* upstream_;
  std::atomic<std::int64_t> bytes_{0}, peak_bytes_{0}, total_bytes_{0};
  std::atomic<std::int64_t> count_{0}, peak_count_{0}, total_count_{0};
};

}  // namespace spillway
