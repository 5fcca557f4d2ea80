// Dispatch and cpu launchers of layer norm: rows in parallel, each row reduced serially; the
// gamma/beta gradients in parallel over column blocks, each summed over rows in order.
#include "kernels/layer_norm.hpp"

#include <math.h>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {

void layer_norm_forward(kernel_context& ctx, stream s, const float* x, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd, int rows, int cols,
                        float eps) {
  SPILLWAY_KERNEL_EXPECTS(rows >= 0 && cols > 0 && eps >= 0.0f, "layer_norm_forward");
  if (rows == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_layer_norm_forward(ctx, s, x, gamma, beta, y, mean, rstd, rows, cols, eps),
                         [=] {
    const auto c = static_cast<std::size_t>(cols);
    detail::parallel_for(static_cast<std::size_t>(rows), detail::grain_for(c), [&](std::size_t b, std::size_t e) {
      for (std::size_t r = b; r < e; ++r) {
        const float* xr = x + r * c;
        float sum = 0.0f;
        for (std::size_t j = 0; j < c; ++j) sum += xr[j];
        const float mu = sum / static_cast<float>(cols);
        float sq = 0.0f;
        for (std::size_t j = 0; j < c; ++j) {
          const float d = xr[j] - mu;
          sq += d * d;
        }
        const float rs = 1.0f / sqrtf(sq / static_cast<float>(cols) + eps);
        mean[r] = mu;
        rstd[r] = rs;
        float* yr = y + r * c;
        for (std::size_t j = 0; j < c; ++j) yr[j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
      }
    });
  });
}

void layer_norm_backward(kernel_context& ctx, stream s, const float* x, const float* gamma,
                         const float* mean, const float* rstd, const float* dy, float* dx,
                         float* dgamma, float* dbeta, int rows, int cols, bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(rows >= 0 && cols > 0, "layer_norm_backward");
  SPILLWAY_KERNEL_LAUNCH(ctx, s,
                         detail::cuda_layer_norm_backward(ctx, s, x, gamma, mean, rstd, dy, dx, dgamma, dbeta,
                                                          rows, cols, accumulate),
                         [=] {
    const auto c = static_cast<std::size_t>(cols);
    const auto nr = static_cast<std::size_t>(rows);
    const auto n = static_cast<float>(cols);
    detail::parallel_for(nr, detail::grain_for(c), [&](std::size_t b, std::size_t e) {
      for (std::size_t r = b; r < e; ++r) {
        const float* xr = x + r * c;
        const float* dyr = dy + r * c;
        float sum_dyg = 0.0f;
        float sum_dyg_xhat = 0.0f;
        for (std::size_t j = 0; j < c; ++j) {
          const float xhat = (xr[j] - mean[r]) * rstd[r];
          const float dyg = dyr[j] * gamma[j];
          sum_dyg += dyg;
          sum_dyg_xhat += dyg * xhat;
        }
        float* dxr = dx + r * c;
        for (std::size_t j = 0; j < c; ++j) {
          const float xhat = (xr[j] - mean[r]) * rstd[r];
          dxr[j] = ops::layer_norm_dx(dyr[j] * gamma[j], xhat, rstd[r], sum_dyg, sum_dyg_xhat, n);
        }
      }
    });
    detail::parallel_for(c, 64, [&](std::size_t b, std::size_t e) {
      if (!accumulate)
        for (std::size_t j = b; j < e; ++j) dgamma[j] = dbeta[j] = 0.0f;
      for (std::size_t r = 0; r < nr; ++r)
        for (std::size_t j = b; j < e; ++j) {
          const float xhat = (x[r * c + j] - mean[r]) * rstd[r];
          dgamma[j] += dy[r * c + j] * xhat;
          dbeta[j] += dy[r * c + j];
        }
    });
  });
}

}  // namespace spillway::kernels
