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

#if defined(__x86_64__) || defined(__i386__)

__attribute__((target("avx2"))) void cpu_adam_avx2(float* p, const float* g, float* m, float* v, std::size_t n,
                                                   const ops::adam_coeffs& c) {
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta1 = _mm256_set1_ps(exact::sub(1.0f, c.beta1));
  const __m256 one_minus_beta2 = _mm256_set1_ps(exact::sub(1.0f, c.beta2));
  const __m256 bc1 = _mm256_set1_ps(c.bias_correction1);
  const __m256 bc2 = _mm256_set1_ps(c.bias_correction2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 lr = _mm256_set1_ps(c.lr);
  const __m256 wd = _mm256_set1_ps(c.weight_decay);
  constexpr std::size_t w = 8;
  std::size_t i = 0;
  for (; i + w <= n; i += w) {
    const __m256 gi = _mm256_loadu_ps(g + i);
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
  }
  for (; i < n; ++i) ops::adam_update(p[i], g[i], m[i], v[i], c);
}

// _mm512_sqrt_ps on every lane, written as the zero-masked form with all lanes selected (the
// same instruction and bits): GCC 12 warns about the unmasked form's undefined pass-through.
__attribute__((target("avx512f"))) inline __m512 sqrt_all(__m512 x) { return _mm512_maskz_sqrt_ps(0xffff, x); }

__attribute__((target("avx512f"))) void cpu_adam_avx512(float* p, const float* g, float* m, float* v,
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
  constexpr std::size_t w = 16;
  std::size_t i = 0;
  for (; i + w <= n; i += w) {
    const __m512 gi = _mm512_loadu_ps(g + i);
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
  }
  for (; i < n; ++i) ops::adam_update(p[i], g[i], m[i], v[i], c);
}

#else  // not x86: cpu_supports never reports AVX, so these are never called

void cpu_adam_avx2(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c) {
  cpu_adam_scalar(p, g, m, v, n, c);
}
void cpu_adam_avx512(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c) {
  cpu_adam_scalar(p, g, m, v, n, c);
}

#endif

}  // namespace spillway::kernels::detail
