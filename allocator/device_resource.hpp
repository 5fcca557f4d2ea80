// The upstream device memory resource: every allocate is a Device::allocate (cudaMalloc).
// Slow and synchronous by design; the arena sits on top of it.
#pragma once

#include "allocator/memory_resource.hpp"

namespace spillway {

class device_resource final : public device_memory_resource {
 public:
  explicit device_resource(Device& device) : device_(&device) {}
  [[nodiscard]] const char* name() const noexcept override { return "device resource"; }
  [[nodiscard]] Device& device() const noexcept { return *device_; }

 private:
  void* do_allocate(std::size_t bytes, stream s) override;
  void do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept override;

  Device* device_;
};

}  // namespace spillway
