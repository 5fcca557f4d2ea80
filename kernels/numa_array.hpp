// numa_array: a host array for optimizer state (CPU Adam's parameters, gradients and moments),
// NUMA-placed with libnuma and first-touched by the threads that will update it.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "kernels/host_parallel.hpp"

namespace spillway::kernels {

/// Node choices besides a node number.
inline constexpr int numa_local_node = -1;  ///< pages on the node of the thread that first writes them
inline constexpr int numa_no_node = -2;     ///< no NUMA placement: plain aligned memory

/// Alignment of every numa_array's data: at least a cache line (NUMA allocations are whole pages).
inline constexpr std::size_t numa_array_alignment = 64;

/// Whether the kernel supports NUMA placement here (libnuma's numa_available() >= 0).
[[nodiscard]] bool numa_supported();

namespace detail {
/// Raw memory of a numa_array. numa_placed is false when the memory is plain aligned memory:
/// numa_no_node was asked for, or the kernel has no NUMA support (numa_available() < 0).
struct numa_block {
  void* data = nullptr;
  std::size_t bytes = 0;
  bool numa_placed = false;
};
/// Allocates `bytes` on `node` (a node number, numa_local_node or numa_no_node); usage_error for
/// a node this machine does not have, out_of_memory when the memory is not there. Not touched.
[[nodiscard]] numa_block numa_allocate(std::size_t bytes, int node);
void numa_release(const numa_block& b) noexcept;
}  // namespace detail

/// n elements of T in host memory, zeroed, placed by `node`: numa_local_node (the default: each
/// page on the node of the thread that zeroes it, and the zeroing runs in parallel with the
/// partition cpu_adam_step updates with, Note [First touch]), a node number (numa_alloc_onnode),
/// or numa_no_node. Where the kernel has no NUMA support it falls back to plain aligned memory
/// (numa_placed() says which). Move-only; T must be trivial (floats, bf16 bits, ...).
template <class T>
class numa_array {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>,
                "numa_array holds plain values");

 public:
  numa_array() = default;
  explicit numa_array(std::size_t n, int node = numa_local_node)
      : block_(detail::numa_allocate(n * sizeof(T), node)), size_(n), node_(node) {
    T* p = data();
    detail::for_each_host_chunk(n, [p](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) p[i] = T{};
    });
  }
  ~numa_array() { detail::numa_release(block_); }
  numa_array(numa_array&& o) noexcept
      : block_(std::exchange(o.block_, {})), size_(std::exchange(o.size_, 0)), node_(o.node_) {}
  numa_array& operator=(numa_array&& o) noexcept {
    if (this != &o) {
      detail::numa_release(block_);
      block_ = std::exchange(o.block_, {});
      size_ = std::exchange(o.size_, 0);
      node_ = o.node_;
    }
    return *this;
  }
  numa_array(const numa_array&) = delete;
  numa_array& operator=(const numa_array&) = delete;

  [[nodiscard]] T* data() noexcept { return static_cast<T*>(block_.data); }
  [[nodiscard]] const T* data() const noexcept { return static_cast<const T*>(block_.data); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] T& operator[](std::size_t i) noexcept { return data()[i]; }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  [[nodiscard]] T* begin() noexcept { return data(); }
  [[nodiscard]] T* end() noexcept { return data() + size_; }
  [[nodiscard]] const T* begin() const noexcept { return data(); }
  [[nodiscard]] const T* end() const noexcept { return data() + size_; }
  [[nodiscard]] std::span<T> span() noexcept { return {data(), size_}; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {data(), size_}; }
  /// The node asked for (a node number, numa_local_node or numa_no_node).
  [[nodiscard]] int node() const noexcept { return node_; }
  /// True when libnuma placed the pages; false for plain aligned memory.
  [[nodiscard]] bool numa_placed() const noexcept { return block_.numa_placed; }

 private:
  detail::numa_block block_;
  std::size_t size_ = 0;
  int node_ = numa_local_node;
};

}  // namespace spillway::kernels
