// bfloat16 as a storage type: the top 16 bits of an IEEE float32 (sign, 8 exponent bits, 7
// mantissa bits). Kernels keep bf16 in memory and compute in float32: they widen on load
// (exact) and narrow on store (rounded), through the SPILLWAY_HD functions below, so the cpu
// and cuda backends convert with the same integer arithmetic and agree bit for bit.
//
// Note [bf16 rounding]
// to_bf16 rounds to nearest, ties to even, on the bit pattern: add 0x7fff plus the lowest kept
// bit, then drop the low 16 bits. Because bf16 has float32's exponent range, this is correct
// for every finite input: normal values, values that round up into the next binade or to
// infinity, and denormals, which stay denormal (nothing is flushed to zero; no conversion
// instruction is used whose denormal handling depends on a mode). Infinities pass through.
// NaN keeps its sign and the top of its payload and is made quiet, so it never rounds to
// infinity. Widening (to_float) appends 16 zero bits: exact.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/hd.hpp"

namespace spillway::kernels {

/// A bfloat16 value in memory (2 bytes). Arithmetic happens in float32: to_float, then to_bf16.
struct bf16 {
  std::uint16_t bits;
};
static_assert(sizeof(bf16) == 2, "bf16 is stored in 2 bytes");

SPILLWAY_HD inline std::uint32_t float_to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

SPILLWAY_HD inline float bits_to_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// float32 -> bf16, round to nearest even, denormals kept (Note [bf16 rounding]).
SPILLWAY_HD inline bf16 to_bf16(float x) {
  const std::uint32_t u = float_to_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(rounded >> 16)};
}

/// bf16 -> float32, exact.
SPILLWAY_HD inline float to_float(bf16 h) { return bits_to_float(static_cast<std::uint32_t>(h.bits) << 16); }

/// Storage-type helpers for kernels templated on T = float or bf16: load widens, store narrows.
SPILLWAY_HD inline float load(float x) { return x; }
SPILLWAY_HD inline float load(bf16 x) { return to_float(x); }
template <class T>
SPILLWAY_HD inline T store_as(float x);
template <>
SPILLWAY_HD inline float store_as<float>(float x) {
  return x;
}
template <>
SPILLWAY_HD inline bf16 store_as<bf16>(float x) {
  return to_bf16(x);
}

}  // namespace spillway::kernels
