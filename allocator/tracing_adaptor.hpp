// Tracing adaptor: keeps the last N allocate/free events through an upstream resource in a
// bounded ring buffer (PyTorch's trace entries), for post-mortems of fragmentation or OOM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "allocator/memory_resource.hpp"

namespace spillway {

struct trace_entry {
  enum class action : std::uint8_t { alloc, free, oom };
  action what = action::alloc;
  std::uintptr_t address = 0;  ///< 0 for oom
  std::size_t size = 0;
  void* stream = nullptr;
  std::uint64_t sequence = 0;  ///< position in the whole history (the ring keeps the last ones)
};

const char* to_string(trace_entry::action a) noexcept;

class tracing_adaptor final : public device_memory_resource {
 public:
  /// Keeps the last `capacity` entries (0 is a config_error).
  tracing_adaptor(device_memory_resource& upstream, std::size_t capacity);
  [[nodiscard]] const char* name() const noexcept override { return "tracing adaptor"; }
  /// The entries kept, oldest first.
  [[nodiscard]] std::vector<trace_entry> entries() const;
  /// Entries recorded in total (including those the ring has dropped).
  [[nodiscard]] std::uint64_t recorded() const;

 private:
  void* do_allocate(std::size_t bytes, stream s) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept override;
  void record(trace_entry::action what, const void* ptr, std::size_t bytes, stream s) noexcept;

  device_memory_resource* upstream_;
  mutable std::mutex mutex_;
  std::vector<trace_entry> ring_;
  std::uint64_t next_ = 0;
};

}  // namespace spillway
