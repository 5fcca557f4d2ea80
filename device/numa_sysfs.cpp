// Reads a PCI device's NUMA node from sysfs. Plain host code, built with or without CUDA.
// The cuda backend uses it to place pinned memory next to the GPU.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>

#include "device/cuda_device.hpp"

namespace spillway {

int numa_node_of_pci_bus(const std::string& pci_bus_id) {
  std::string id = pci_bus_id;
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // The runtime may report an 8-digit domain ("00000000:3b:00.0"); sysfs uses four.
  if (auto colon = id.find(':'); colon != std::string::npos && colon > 4) id = id.substr(colon - 4);
  std::ifstream in("/sys/bus/pci/devices/" + id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node < 0 ? -1 : node;
}

}  // namespace spillway
