// The cuda backend: a thin shim over the CUDA runtime. Every runtime error becomes a
// spillway::cuda_error naming the call (out-of-memory becomes spillway::out_of_memory).
// Compiled whenever the build finds the CUDA toolkit, so CI always compiles and links it.
#pragma once

#include <memory>
#include <string>

#include "device/device.hpp"

namespace spillway {

/// Creates the cuda backend for GPU `options.cuda_device`. Throws cuda_error when none answers.
std::unique_ptr<Device> make_cuda_device(const device_options& options);

/// What the runtime says of the GPUs: how many answer, and why none does where that is a
/// problem (empty when there is simply no driver or no GPU).
struct cuda_probe {
  int count = 0;
  std::string problem;
};
cuda_probe probe_cuda() noexcept;

/// The host NUMA node of a PCI device from sysfs ("0000:3b:00.0" -> 0); -1 when unknown.
int numa_node_of_pci_bus(const std::string& pci_bus_id);

}  // namespace spillway
