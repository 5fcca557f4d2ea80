// The upstream device memory resource and the request checks shared by every resource.
// Deallocation waits for the stream of last use, since Device::deallocate frees at once.
#include "allocator/device_resource.hpp"

#include <cassert>
#include <string>

#include "device/error.hpp"
#include "device/log.hpp"
#include "device/units.hpp"

namespace spillway {

void detail::throw_bad_request_size(std::size_t bytes, const char* who) {
  if (bytes == 0) throw config_error(std::string(who) + ": cannot allocate 0 bytes");
  throw config_error(std::string(who) + ": cannot allocate " + std::to_string(bytes) + " bytes (" +
                     format_bytes(bytes) + "), more than the largest size Spillway accepts (" +
                     format_bytes(max_size_bytes) + ")");
}

void* device_resource::do_allocate(std::size_t bytes, stream /*s*/) {
  const std::size_t total = device_->properties().total_memory;
  if (bytes > total) {
    throw out_of_memory("device resource: cannot allocate " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                        " bytes): more than the device's total memory of " + format_bytes(total));
  }
  return device_->allocate(bytes);
}

void device_resource::do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept {
  // Device::deallocate frees at once (the cpu backend really does), so wait until the stream of
  // last use has finished with the memory. An event wait does not consume sticky stream errors.
  if (s.handle != nullptr) {
    try {
      owned_event done(*device_);
      device_->record_event(done, s);
      device_->synchronize_event(done);
    } catch (const std::exception& e) {
      log(log_level::error, std::string("device resource: could not wait for the stream before freeing: ") + e.what());
    }
  }
  device_->deallocate(ptr, bytes);
}

}  // namespace spillway
