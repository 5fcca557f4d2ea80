// Dispatch and cpu launcher of softmax with cross-entropy: one row per task, each row's max and
// sum taken serially in column order, the mean over rows taken serially in row order. One body
// serves float32 and bf16 logits (widen on load, narrow each gradient once).
#include "kernels/softmax_cross_entropy.hpp"

#include <math.h>

#include <string>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"

namespace spillway::kernels {
namespace {

/// The target check both backends make on the stream (a usage_error at the next synchronize):
/// the cpu launcher for each row in order, the cuda one for the first row its report names
/// (Note [Reports from kernels]). A negative target is no error: it ignores its row.
void check_target(std::int32_t target, std::size_t row, int cols) {
  SPILLWAY_EXPECTS_T(usage_error, target < cols,
                     "softmax_cross_entropy: target " + std::to_string(target) + " of row " + std::to_string(row) +
                         " is past the " + std::to_string(cols) + " classes");
}

template <class T>
void softmax_xent(kernel_context& ctx, stream s, const T* logits, const std::int32_t* targets, float* losses,
                  float* mean_loss, T* dlogits, int rows, int cols, float grad_scale) {
  SPILLWAY_KERNEL_EXPECTS(rows > 0 && cols > 0, "softmax_cross_entropy");
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) {
    // The kernels write the first row whose target is past the classes into a report slot; a
    // host function after them throws the cpu launcher's error for it (Note [Reports from kernels]).
    detail::launch_with_report(
        ctx, s,
        [&](std::int32_t* report) {
          detail::cuda_softmax_cross_entropy(ctx, s, logits, targets, losses, mean_loss, dlogits, rows, cols,
                                             grad_scale, report);
        },
        [cols](std::int32_t row, std::int32_t target) {
          if (row >= 0) check_target(target, static_cast<std::size_t>(row), cols);
        });
    return;
  }
#endif
  // Without `losses`, the row losses go to the bound workspace (Note [Workspace]), taken here
  // at the launch so that a missing one is an error of the call, not of the stream.
  float* row_loss = losses != nullptr ? losses
                                      : static_cast<float*>(ctx.workspace(softmax_cross_entropy_workspace_bytes(rows),
                                                                          "softmax_cross_entropy"));
  detail::enqueue_cpu(ctx, s, [=] {
    const auto c = static_cast<std::size_t>(cols);
    const auto nr = static_cast<std::size_t>(rows);
    for (std::size_t r = 0; r < nr; ++r) check_target(targets[r], r, cols);
    detail::parallel_for(nr, detail::grain_for(c, 1u << 13), [&](std::size_t b, std::size_t e) {
      for (std::size_t r = b; r < e; ++r) {
        const T* x = logits + r * c;
        const std::int32_t t = targets[r];
        float mx = load(x[0]);
        for (std::size_t j = 1; j < c; ++j) mx = load(x[j]) > mx ? load(x[j]) : mx;
        float sum = 0.0f;
        for (std::size_t j = 0; j < c; ++j) sum += expf(load(x[j]) - mx);
        const float log_sum = logf(sum);
        row_loss[r] = t < 0 ? 0.0f : log_sum - (load(x[t]) - mx);
        if (dlogits == nullptr) continue;
        T* g = dlogits + r * c;
        const float inv = 1.0f / sum;
        for (std::size_t j = 0; j < c; ++j) {
          if (t < 0) {
            g[j] = store_as<T>(0.0f);
            continue;
          }
          const float p = expf(load(x[j]) - mx) * inv;
          g[j] = store_as<T>(grad_scale * (p - (static_cast<std::int32_t>(j) == t ? 1.0f : 0.0f)));
        }
      }
    });
    if (mean_loss != nullptr) {
      float total = 0.0f;
      for (std::size_t r = 0; r < nr; ++r) total += row_loss[r];
      *mean_loss = total / static_cast<float>(rows);
    }
  });
}

}  // namespace

void softmax_cross_entropy(kernel_context& ctx, stream s, const float* logits, const std::int32_t* targets,
                           float* losses, float* mean_loss, float* dlogits, int rows, int cols,
                           float grad_scale) {
  softmax_xent(ctx, s, logits, targets, losses, mean_loss, dlogits, rows, cols, grad_scale);
}

void softmax_cross_entropy(kernel_context& ctx, stream s, const bf16* logits, const std::int32_t* targets,
                           float* losses, float* mean_loss, bf16* dlogits, int rows, int cols, float grad_scale) {
  softmax_xent(ctx, s, logits, targets, losses, mean_loss, dlogits, rows, cols, grad_scale);
}

}  // namespace spillway::kernels
