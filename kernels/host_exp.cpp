// Exponentials for the cpu launchers (Note [Host exponentials]).
#include "kernels/host_exp.hpp"

#include <math.h>

#if SPILLWAY_HAVE_MVEC
#include <immintrin.h>

// glibc's 4-wide expf (libmvec, x86-64 vector ABI, SSE variant).
extern "C" __m128 _ZGVbN4v_expf(__m128);
#endif

namespace spillway::kernels::detail {

void exp_in_place(float* v, std::size_t n) {
#if SPILLWAY_HAVE_MVEC
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(v + i, _ZGVbN4v_expf(_mm_loadu_ps(v + i)));
  if (i < n) {  // the last one to three values, in lanes of their own
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (std::size_t k = i; k < n; ++k) t[k - i] = v[k];
    _mm_storeu_ps(t, _ZGVbN4v_expf(_mm_loadu_ps(t)));
    for (std::size_t k = i; k < n; ++k) v[k] = t[k - i];
  }
#else
  for (std::size_t i = 0; i < n; ++i) v[i] = expf(v[i]);
#endif
}

float host_exp(float x) {
  exp_in_place(&x, 1);
  return x;
}

}  // namespace spillway::kernels::detail
