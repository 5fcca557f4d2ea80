// Correctly rounded float operations for SPILLWAY_HD bodies: one rounding per operation, in the
// order written, the same bits on the host (g++) and on the device (nvcc). See Note [Exact math].
#pragma once

#include <math.h>  // sqrtf in the global namespace for both g++ and nvcc

#include "kernels/hd.hpp"

// Note [Exact math]
// A body that must give the same bits on every backend (Adam's update: the CPU Adam, the cpu
// launcher and the cuda launcher all run it) follows four rules:
//   1. The order of operations is fixed as written: every step is one call below, so no
//      compiler may reassociate (a + b) + c into a + (b + c).
//   2. No contraction: a * b + c is a multiply rounded, then an add rounded, never one fused
//      multiply-add. nvcc contracts by default (--fmad=true), so on the device these helpers
//      call the _rn intrinsics, which it never fuses; g++ fuses wherever FMA is enabled (a
//      target("avx512f") function, -march=native), so kernels/ builds with -ffp-contract=off.
//   3. Division and square root are correctly rounded (IEEE): __fdiv_rn and __fsqrt_rn on the
//      device whatever -prec-div / -prec-sqrt say; sqrtss / divss (and their vector forms) on
//      the host. No reciprocal or rsqrt approximations.
//   4. Denormals are kept: nothing sets flush-to-zero or denormals-are-zero (no -ffast-math,
//      -ftz=true or --use_fast_math anywhere in the build), so a tiny moment stays tiny.
// A vectorised version of such a body (kernels/cpu_adam_isa.cpp) uses separate mul, add, div
// and sqrt intrinsics in the same order, so it matches these helpers bit for bit.

namespace spillway::kernels::exact {

SPILLWAY_HD inline float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

SPILLWAY_HD inline float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

SPILLWAY_HD inline float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

SPILLWAY_HD inline float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

SPILLWAY_HD inline float sqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return sqrtf(a);
#endif
}

}  // namespace spillway::kernels::exact
