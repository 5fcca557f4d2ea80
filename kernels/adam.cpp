// Dispatch and cpu launcher of Adam: bias corrections worked out once on the host, then the
// shared per-element update over the buffer in parallel.
#include "kernels/adam.hpp"

#include <cmath>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {

void adam_step(kernel_context& ctx, stream s, float* params, const float* grads, float* m, float* v,
               std::size_t n, const adam_config& config, std::int64_t step) {
  SPILLWAY_KERNEL_EXPECTS(step >= 1, "adam_step: step counts from 1");
  SPILLWAY_KERNEL_EXPECTS(config.beta1 >= 0.0f && config.beta1 < 1.0f && config.beta2 >= 0.0f &&
                              config.beta2 < 1.0f && config.eps >= 0.0f,
                          "adam_step: betas must be in [0, 1)");
  if (n == 0) return;
  const ops::adam_coeffs c{config.lr,
                           config.beta1,
                           config.beta2,
                           config.eps,
                           config.weight_decay,
                           static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), static_cast<double>(step))),
                           static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), static_cast<double>(step)))};
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_adam_step(ctx, s, params, grads, m, v, n, c), [=] {
    detail::parallel_for(n, 1u << 14, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) ops::adam_update(params[i], grads[i], m[i], v[i], c);
    });
  });
}

}  // namespace spillway::kernels
