// Softmax with cross-entropy over the rows of a logits matrix: per-row losses, their mean, and
// the gradient of (grad_scale * sum of losses) with respect to the logits, in one pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace spillway::kernels {

/// logits [rows, cols]; targets [rows] in [0, cols) (a target < 0 ignores the row: loss 0,
/// gradient 0). Writes losses[rows] (may be nullptr), *mean_loss = sum(losses) / rows (may be
/// nullptr; one float in device memory), and, when dlogits != nullptr, dlogits [rows, cols] =
/// grad_scale * (softmax(logits) - onehot(target)). For the mean loss pass grad_scale = 1/rows.
/// dlogits may alias logits. With losses == nullptr the row losses go to the bound workspace,
/// which must hold softmax_cross_entropy_workspace_bytes(rows) (Note [Workspace]).
void softmax_cross_entropy(kernel_context& ctx, stream s, const float* logits, const std::int32_t* targets,
                           float* losses, float* mean_loss, float* dlogits, int rows, int cols,
                           float grad_scale);

/// bf16 logits and dlogits (which may alias); losses and mean_loss stay float32. The same
/// arithmetic in float32 as the float32 kernel on the widened logits, each dlogits element
/// narrowed once: the losses are the float32 kernel's, dlogits to_bf16 of its gradient.
void softmax_cross_entropy(kernel_context& ctx, stream s, const bf16* logits, const std::int32_t* targets,
                           float* losses, float* mean_loss, bf16* dlogits, int rows, int cols, float grad_scale);

/// Workspace softmax_cross_entropy needs when `losses` is nullptr, on both backends: the row
/// losses, rounded up to 256 bytes.
[[nodiscard]] constexpr std::size_t softmax_cross_entropy_workspace_bytes(int rows) noexcept {
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(rows > 0 ? rows : 0);
  return (bytes + 255) / 256 * 256;
}

}  // namespace spillway::kernels
