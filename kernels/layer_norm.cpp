// Dispatch and cpu launchers of layer norm: rows in parallel, each row reduced serially (the
// forward's mean and variance in float64); the gamma/beta gradients in parallel over column
// blocks, each summed over rows in order. One body per kernel serves float32 and bf16 storage
// (widen on load, narrow once on store).
#include "kernels/layer_norm.hpp"

#include <math.h>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {
namespace {

template <class T>
void forward(kernel_context& ctx, stream s, const T* x, const T* gamma, const T* beta, T* y, float* mean,
             float* rstd, int rows, int cols, float eps) {
  SPILLWAY_KERNEL_EXPECTS(rows >= 0 && cols > 0 && eps >= 0.0f, "layer_norm_forward");
  if (rows == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_layer_norm_forward(ctx, s, x, gamma, beta, y, mean, rstd, rows, cols, eps),
                         [=] {
    const auto c = static_cast<std::size_t>(cols);
    detail::parallel_for(static_cast<std::size_t>(rows), detail::grain_for(c), [&](std::size_t b, std::size_t e) {
      for (std::size_t r = b; r < e; ++r) {
        // The row's sums run serially in column order in float64, so
        // a row far from zero keeps its mean and variance (a float32 running sum of values near
        // 1e4 loses their fractions once it passes 2^24), and they repeat bit for bit.
        const T* xr = x + r * c;
        double sum = 0.0;
        for (std::size_t j = 0; j < c; ++j) sum += static_cast<double>(load(xr[j]));
        const double mu = sum / static_cast<double>(cols);
        double sq = 0.0;
        for (std::size_t j = 0; j < c; ++j) {
          const double d = static_cast<double>(load(xr[j])) - mu;
          sq += d * d;
        }
        const float rs = 1.0f / sqrtf(static_cast<float>(sq / static_cast<double>(cols)) + eps);
        mean[r] = static_cast<float>(mu);
        rstd[r] = rs;
        T* yr = y + r * c;
        for (std::size_t j = 0; j < c; ++j) {
          // x - mean in double too: the float32 mean of such a row is off by up to half its last
          // bit (1/2048 near 1e4), which would be the error of every normalised value.
          const auto d = static_cast<float>(static_cast<double>(load(xr[j])) - mu);
          yr[j] = store_as<T>(d * rs * load(gamma[j]) + load(beta[j]));
        }
      }
    });
  });
}

template <class T>
void backward(kernel_context& ctx, stream s, const T* x, const T* gamma, const float* mean, const float* rstd,
              const T* dy, T* dx, T* dgamma, T* dbeta, int rows, int cols, bool accumulate) {
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
        const T* xr = x + r * c;
        const T* dyr = dy + r * c;
        float sum_dyg = 0.0f;
        float sum_dyg_xhat = 0.0f;
        for (std::size_t j = 0; j < c; ++j) {
          const float xhat = (load(xr[j]) - mean[r]) * rstd[r];
          const float dyg = load(dyr[j]) * load(gamma[j]);
          sum_dyg += dyg;
          sum_dyg_xhat += dyg * xhat;
        }
        T* dxr = dx + r * c;
        for (std::size_t j = 0; j < c; ++j) {
          const float xhat = (load(xr[j]) - mean[r]) * rstd[r];
          dxr[j] = store_as<T>(
              ops::layer_norm_dx(load(dyr[j]) * load(gamma[j]), xhat, rstd[r], sum_dyg, sum_dyg_xhat, n));
        }
      }
    });
    // Column blocks of at most `block`; each block sums its columns over the rows in order, in
    // float32 locals, and stores each sum once.
    constexpr std::size_t block = 64;
    detail::parallel_for((c + block - 1) / block, 1, [&](std::size_t bb, std::size_t be) {
      for (std::size_t blk = bb; blk < be; ++blk) {
        const std::size_t j0 = blk * block;
        const std::size_t j1 = j0 + block < c ? j0 + block : c;
        float g[block];
        float bsum[block];
        for (std::size_t j = j0; j < j1; ++j) {
          g[j - j0] = accumulate ? load(dgamma[j]) : 0.0f;
          bsum[j - j0] = accumulate ? load(dbeta[j]) : 0.0f;
        }
        for (std::size_t r = 0; r < nr; ++r)
          for (std::size_t j = j0; j < j1; ++j) {
            const float xhat = (load(x[r * c + j]) - mean[r]) * rstd[r];
            g[j - j0] += load(dy[r * c + j]) * xhat;
            bsum[j - j0] += load(dy[r * c + j]);
          }
        for (std::size_t j = j0; j < j1; ++j) {
          dgamma[j] = store_as<T>(g[j - j0]);
          dbeta[j] = store_as<T>(bsum[j - j0]);
        }
      }
    });
  });
}

}  // namespace

void layer_norm_forward(kernel_context& ctx, stream s, const float* x, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd, int rows, int cols,
                        float eps) {
  forward(ctx, s, x, gamma, beta, y, mean, rstd, rows, cols, eps);
}

void layer_norm_forward(kernel_context& ctx, stream s, const bf16* x, const bf16* gamma, const bf16* beta,
                        bf16* y, float* mean, float* rstd, int rows, int cols, float eps) {
  forward(ctx, s, x, gamma, beta, y, mean, rstd, rows, cols, eps);
}

void layer_norm_backward(kernel_context& ctx, stream s, const float* x, const float* gamma,
                         const float* mean, const float* rstd, const float* dy, float* dx,
                         float* dgamma, float* dbeta, int rows, int cols, bool accumulate) {
  backward(ctx, s, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols, accumulate);
}

void layer_norm_backward(kernel_context& ctx, stream s, const bf16* x, const bf16* gamma, const float* mean,
                         const float* rstd, const bf16* dy, bf16* dx, bf16* dgamma, bf16* dbeta, int rows,
                         int cols, bool accumulate) {
  backward(ctx, s, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols, accumulate);
}

}  // namespace spillway::kernels
