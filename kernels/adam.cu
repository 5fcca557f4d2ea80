// The cuda backend's Adam step: one thread per parameter running the shared ops::adam_update.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::detail {
namespace {

struct adam_f {
  float* p;
  const float* g;
  float* m;
  float* v;
  ops::adam_coeffs c;
  __device__ void operator()(std::size_t i) const { ops::adam_update(p[i], g[i], m[i], v[i], c); }
};

struct adam_mixed_f {
  float* p;
  const bf16* g;
  float* m;
  float* v;
  bf16* w;
  ops::adam_coeffs c;
  __device__ void operator()(std::size_t i) const { ops::adam_update_mixed(p[i], g[i], m[i], v[i], w[i], c); }
};

}  // namespace

void cuda_adam_step_mixed(kernel_context&, stream s, float* master, const bf16* grads, float* m, float* v,
                          bf16* weights, std::size_t n, const ops::adam_coeffs& c) {
  SPILLWAY_CUDA_MAP("adam (bf16)", s, n, (adam_mixed_f{master, grads, m, v, weights, c}));
}

void cuda_adam_step(kernel_context&, stream s, float* params, const float* grads, float* m, float* v,
                    std::size_t n, const ops::adam_coeffs& c) {
  SPILLWAY_CUDA_MAP("adam", s, n, (adam_f{params, grads, m, v, c}));
}

}  // namespace spillway::kernels::detail
