// Dispatch and cpu launcher of Adam: bias corrections worked out once on the host, then the
// shared per-element update over the buffer in parallel.
#include "kernels/adam.hpp"

#include <cmath>
#include <string>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {

ops::adam_coeffs make_adam_coeffs(const adam_config& config, std::int64_t step, const char* kernel) {
  const std::string k(kernel);
  SPILLWAY_KERNEL_EXPECTS(step >= 1, k + ": step counts from 1");
  SPILLWAY_KERNEL_EXPECTS(config.beta1 >= 0.0f && config.beta1 < 1.0f && config.beta2 >= 0.0f &&
                              config.beta2 < 1.0f && config.eps >= 0.0f,
                          k + ": betas must be in [0, 1) and eps at least 0");
  const auto correction = [step](float beta) {
    return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
  };
  return ops::adam_coeffs{config.lr,           config.beta1,          config.beta2,
                          config.eps,          config.weight_decay,   correction(config.beta1),
                          correction(config.beta2)};
}

void adam_step(kernel_context& ctx, stream s, float* params, const float* grads, float* m, float* v,
               std::size_t n, const adam_config& config, std::int64_t step) {
  const ops::adam_coeffs c = make_adam_coeffs(config, step, "adam_step");
  if (n == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_adam_step(ctx, s, params, grads, m, v, n, c), [=] {
    detail::parallel_for(n, 1u << 14, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) ops::adam_update(params[i], grads[i], m[i], v[i], c);
    });
  });
}

void adam_step(kernel_context& ctx, stream s, float* master, const bf16* grads, float* m, float* v, bf16* weights,
               std::size_t n, const adam_config& config, std::int64_t step) {
  const ops::adam_coeffs c = make_adam_coeffs(config, step, "adam_step (bf16)");
  if (n == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_adam_step_mixed(ctx, s, master, grads, m, v, weights, n, c), [=] {
    detail::parallel_for(n, 1u << 14, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) ops::adam_update_mixed(master[i], grads[i], m[i], v[i], weights[i], c);
    });
  });
}

}  // namespace spillway::kernels
