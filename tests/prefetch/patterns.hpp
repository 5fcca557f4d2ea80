// Byte patterns the executor tests fill tensors with and check.
#pragma once

#include <cstddef>
#include <cstring>

namespace spillway::test {

inline void fill(void* p, std::size_t n, unsigned char v) { std::memset(p, v, n); }

inline bool holds(const void* p, std::size_t n, unsigned char v) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (b[i] != v) return false;
  return true;
}

}  // namespace spillway::test
