// Helpers for the bf16 kernel tests: rounding vectors to bf16 and widening them back, bitwise
// comparison, and inputs that bf16 holds exactly (so the float32 kernel sees the same values).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernel_rig.hpp"
#include "kernels/bf16.hpp"

namespace spillway::kernels::testing {

/// Each value rounded to bf16 (to_bf16, the rounding the kernels use).
inline std::vector<bf16> round_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}

/// Each value widened to float32 (exact).
inline std::vector<float> widen_bf16(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}

/// n random bf16 values in [lo, hi).
inline std::vector<bf16> random_bf16(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return round_bf16(random_floats(n, seed, lo, hi));
}

/// bf16 values as a kernel of storage type T takes them: themselves, or widened for float.
template <class T>
std::vector<T> in_storage(const std::vector<bf16>& v) {
  if constexpr (std::is_same_v<T, bf16>)
    return v;
  else
    return widen_bf16(v);
}

/// Expects got to hold exactly the bits of want; reports the first element that differs.
inline void expect_same_bits(const std::vector<bf16>& got, const std::vector<bf16>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i].bits != want[i].bits) {
      ADD_FAILURE() << what << " element " << i << ": got " << to_float(got[i]) << " (0x" << std::hex << got[i].bits
                    << "), want " << to_float(want[i]) << " (0x" << want[i].bits << std::dec << ")";
      return;
    }
}

inline void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want " << want[i];
      return;
    }
}

/// Expects a bf16 result within `ulps` bf16 steps (at most 2^-7 of the value each) plus abs_tol of want.
inline void expect_near_bf16(const std::vector<bf16>& got, const std::vector<bf16>& want, double abs_tol,
                             double ulps, const std::string& what) {
  expect_near_all(widen_bf16(got), widen_bf16(want), abs_tol, ulps / 128.0, what);
}

}  // namespace spillway::kernels::testing
