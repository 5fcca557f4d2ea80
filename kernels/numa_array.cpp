// numa_array's memory: libnuma where the kernel supports NUMA, plain aligned memory otherwise.
#include "kernels/numa_array.hpp"

#include <numa.h>

#include <cstdlib>
#include <string>

#include "device/error.hpp"

namespace spillway::kernels {

bool numa_supported() { return numa_available() >= 0; }

namespace detail {

numa_block numa_allocate(std::size_t bytes, int node) {
  SPILLWAY_EXPECTS_T(usage_error, node >= numa_no_node,
                     "numa_array: node " + std::to_string(node) +
                         " is neither a node number, numa_local_node nor numa_no_node");
  if (bytes == 0) return {};
  const bool numa = node != numa_no_node && numa_available() >= 0;
  if (numa && node >= 0) {
    SPILLWAY_EXPECTS_T(usage_error, node <= numa_max_node(),
                       "numa_array: node " + std::to_string(node) + " is not a NUMA node of this machine (highest is " +
                           std::to_string(numa_max_node()) + ")");
  }
  numa_block b;
  b.bytes = bytes;
  if (numa) {
    // Whole pages, so the alignment is a page; the pages are placed when first touched.
    b.data = node >= 0 ? numa_alloc_onnode(bytes, node) : numa_alloc_local(bytes);
    b.numa_placed = true;
  } else {
    const std::size_t rounded = (bytes + numa_array_alignment - 1) / numa_array_alignment * numa_array_alignment;
    b.data = std::aligned_alloc(numa_array_alignment, rounded);
  }
  if (b.data == nullptr)
    throw out_of_memory("numa_array: cannot allocate " + std::to_string(bytes) + " bytes of host memory" +
                        (node >= 0 ? " on NUMA node " + std::to_string(node) : std::string()));
  return b;
}

void numa_release(const numa_block& b) noexcept {
  if (b.data == nullptr) return;
  if (b.numa_placed)
    numa_free(b.data, b.bytes);
  else
    std::free(b.data);
}

}  // namespace detail
}  // namespace spillway::kernels
