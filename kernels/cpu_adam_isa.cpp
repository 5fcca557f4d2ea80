// The CPU Adam's bodies: scalar, AVX2 and AVX-512F, each only in functions compiled for its
// instruction set (target attributes), so the library runs on any x86-64 and picks at run time.
#include "kernels/cpu_adam.hpp"
#include "kernels/ops.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// Each vector body repeats ops::adam_update operation for operation, in its order, with separate
// mul, add, sub, div and sqrt (correctly rounded, Note [Exact math]); never an FMA. GCC writes
// these intrinsics as plain vector arithmetic, which it would fuse where FMA is enabled (every
// AVX-512F function) were kernels/ not built with -ffp-contract=off.

namespace spillway::kernels::detail {

void cpu_adam_scalar(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c) {
  for (std::size_t i = 0; i < n; ++i) ops::adam_update(p[i], g[i], m[i], v[i], c);
}

void cpu_adam_mixed_scalar(float* p, const bf16* g, float* m, float* v, bf16* w, std::size_t n,
                           const ops::adam_coeffs& c) {
  for (std::size_t i = 0; i < n; ++i) ops::adam_update_mixed(p[i], g[i], m[i], v[i], w[i], c);
}

#if defined(__x86_64__) || defined(__i386__)

namespace {

// Mixed precision in vectors: bf16 widened by a shift (exact), and narrowed as to_bf16 does
// (Note [bf16 rounding]): add 0x7fff plus the lowest kept bit and drop 16 bits; NaN made quiet.
__attribute__((target("avx2"))) inline __m256 widen8(const bf16* g) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2"))) inline void narrow8(__m256 x, bf16* w) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i lowest_kept = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lowest_kept)), 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
  const __m256i bits = _mm256_blendv_epi8(rounded, quiet, is_nan);
  // Every lane holds 16 bits: pack them (within each 128-bit half), then bring the halves together.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(w), _mm256_castsi256_si128(packed));
}

// The AVX2 body; with Mixed, g holds bf16 gradients and the new weights go to w in bf16.
template <bool Mixed>
__attribute__((target("avx2"))) void adam_avx2(float* p, const void* grads, float* m, float* v, bf16* w,
                                               std::size_t n, const ops::adam_coeffs& c) {
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta1 = _mm256_set1_ps(exact::sub(1.0f, c.beta1));
  const __m256 one_minus_beta2 = _mm256_set1_ps(exact::sub(1.0f, c.beta2));
  const __m256 bc1 = _mm256_set1_ps(c.bias_correction1);
  const __m256 bc2 = _mm256_set1_ps(c.bias_correction2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 lr = _mm256_set1_ps(c.lr);
  const __m256 wd = _mm256_set1_ps(c.weight_decay);
  constexpr std::size_t width = 8;
  std::size_t i = 0;
  for (; i + width <= n; i += width) {
    __m256 gi;
    if constexpr (Mixed)
      gi = widen8(static_cast<const bf16*>(grads) + i);
    else
      gi = _mm256_loadu_ps(static_cast<const float*>(grads) + i);
    __m256 mi = _mm256_loadu_ps(m + i);
    __m256 vi = _mm256_loadu_ps(v + i);
    __m256 pi = _mm256_loadu_ps(p + i);
    mi = _mm256_add_ps(_mm256_mul_ps(beta1, mi), _mm256_mul_ps(one_minus_beta1, gi));
    vi = _mm256_add_ps(_mm256_mul_ps(beta2, vi), _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, gi), gi));
    const __m256 m_hat = _mm256_div_ps(mi, bc1);
    const __m256 v_hat = _mm256_div_ps(vi, bc2);
    const __m256 step =
        _mm256_add_ps(_mm256_div_ps(m_hat, _mm256_add_ps(_mm256_sqrt_ps(v_hat), eps)), _mm256_mul_ps(wd, pi));
    pi = _mm256_sub_ps(pi, _mm256_mul_ps(lr, step));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
    if constexpr (Mixed) narrow8(pi, w + i);
  }
  if constexpr (Mixed)
    cpu_adam_mixed_scalar(p + i, static_cast<const bf16*>(grads) + i, m + i, v + i, w + i, n - i, c);
  else
    cpu_adam_scalar(p + i, static_cast<const float*>(grads) + i, m + i, v + i, n - i, c);
}

}  // namespace

void cpu_adam_avx2(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c) {
  adam_avx2<false>(p, g, m, v, nullptr, n, c);
}
void cpu_adam_mixed_avx2(float* p, const bf16* g, float* m, float* v, bf16* w, std::size_t n,
                         const ops::adam_coeffs& c) {
  adam_avx2<true>(p, g, m, v, w, n, c);
}

// _mm512_sqrt_ps on every lane, written as the zero-masked form with all lanes selected (the
// same instruction and bits): GCC 12 warns about the unmasked form's undefined pass-through.
__attribute__((target("avx512f"))) inline __m512 sqrt_all(__m512 x) { return _mm512_maskz_sqrt_ps(0xffff, x); }

namespace {

// Every lane selected: the zero-masked forms are the same instructions and bits as the unmasked
// ones, without GCC 12's warning about the unmasked forms' undefined pass-through (see sqrt_all).
constexpr __mmask16 all16 = 0xffff;

__attribute__((target("avx512f"))) inline __m512 widen16(const bf16* g) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all16, _mm512_maskz_cvtepu16_epi32(all16, h), 16));
}

__attribute__((target("avx512f"))) inline void narrow16(__m512 x, bf16* w) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i high = _mm512_maskz_srli_epi32(all16, u, 16);
  const __mmask16 is_nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i lowest_kept = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_maskz_srli_epi32(all16, _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lowest_kept)), 16);
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x0040));
  const __m512i bits = _mm512_mask_blend_epi32(is_nan, rounded, quiet);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(w), _mm512_maskz_cvtepi32_epi16(all16, bits));
}

template <bool Mixed>
__attribute__((target("avx512f"))) void adam_avx512(float* p, const void* grads, float* m, float* v, bf16* w,
                                                    std::size_t n, const ops::adam_coeffs& c) {
  const __m512 beta1 = _mm512_set1_ps(c.beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta1 = _mm512_set1_ps(exact::sub(1.0f, c.beta1));
  const __m512 one_minus_beta2 = _mm512_set1_ps(exact::sub(1.0f, c.beta2));
  const __m512 bc1 = _mm512_set1_ps(c.bias_correction1);
  const __m512 bc2 = _mm512_set1_ps(c.bias_correction2);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 lr = _mm512_set1_ps(c.lr);
  const __m512 wd = _mm512_set1_ps(c.weight_decay);
  constexpr std::size_t width = 16;
  std::size_t i = 0;
  for (; i + width <= n; i += width) {
    __m512 gi;
    if constexpr (Mixed)
      gi = widen16(static_cast<const bf16*>(grads) + i);
    else
      gi = _mm512_loadu_ps(static_cast<const float*>(grads) + i);
    __m512 mi = _mm512_loadu_ps(m + i);
    __m512 vi = _mm512_loadu_ps(v + i);
    __m512 pi = _mm512_loadu_ps(p + i);
    mi = _mm512_add_ps(_mm512_mul_ps(beta1, mi), _mm512_mul_ps(one_minus_beta1, gi));
    vi = _mm512_add_ps(_mm512_mul_ps(beta2, vi), _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, gi), gi));
    const __m512 m_hat = _mm512_div_ps(mi, bc1);
    const __m512 v_hat = _mm512_div_ps(vi, bc2);
    const __m512 step =
        _mm512_add_ps(_mm512_div_ps(m_hat, _mm512_add_ps(sqrt_all(v_hat), eps)), _mm512_mul_ps(wd, pi));
    pi = _mm512_sub_ps(pi, _mm512_mul_ps(lr, step));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, pi);
    if constexpr (Mixed) narrow16(pi, w + i);
  }
  if constexpr (Mixed)
    cpu_adam_mixed_scalar(p + i, static_cast<const bf16*>(grads) + i, m + i, v + i, w + i, n - i, c);
  else
    cpu_adam_scalar(p + i, static_cast<const float*>(grads) + i, m + i, v + i, n - i, c);
}

}  // namespace

void cpu_adam_avx512(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c) {
  adam_avx512<false>(p, g, m, v, nullptr, n, c);
}
void cpu_adam_mixed_avx512(float* p, const bf16* g, float* m, float* v, bf16* w, std::size_t n,
                           const ops::adam_coeffs& c) {
  adam_avx512<true>(p, g, m, v, w, n, c);
}

#else  // not x86: cpu_supports never reports AVX, so these are never called

void cpu_adam_avx2(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c) {
  cpu_adam_scalar(p, g, m, v, n, c);
}
void cpu_adam_avx512(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c) {
  cpu_adam_scalar(p, g, m, v, n, c);
}
void cpu_adam_mixed_avx2(float* p, const bf16* g, float* m, float* v, bf16* w, std::size_t n,
                         const ops::adam_coeffs& c) {
  cpu_adam_mixed_scalar(p, g, m, v, w, n, c);
}
void cpu_adam_mixed_avx512(float* p, const bf16* g, float* m, float* v, bf16* w, std::size_t n,
                           const ops::adam_coeffs& c) {
  cpu_adam_mixed_scalar(p, g, m, v, w, n, c);
}

#endif

}  // namespace spillway::kernels::detail
