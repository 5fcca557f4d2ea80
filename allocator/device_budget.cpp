// The device budget's two answers that need the device: the default budget and the check
// against what the device has (Note [Headroom] in device_budget.hpp).
#include "allocator/device_budget.hpp"

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway {

device_budget device_budget::of_free_memory(Device& device) {
  const std::uint64_t free = device.free_memory();
  const std::uint64_t usable = device.properties().backend == backend::cpu ? free : free - free / 16;
  return device_budget(usable / granule * granule);
}

void device_budget::check_fits(const Device& device) const {
  const std::uint64_t total = device.properties().total_memory;
  if (bytes_ == 0) throw config_error("device budget of 0 bytes: give at least the largest op's working set");
  if (bytes_ > total) {
    throw config_error("device budget " + format_bytes(bytes_) + " is larger than the device's " + format_bytes(total) +
                       " (" + device.properties().name + "); give at most " + format_bytes(total));
  }
}

}  // namespace spillway
