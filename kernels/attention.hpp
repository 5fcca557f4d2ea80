// Causal multi-head self-attention, forward and backward, composed of strided-batched GEMMs
// and a masked (causal) softmax, so both backends share one composition.
#pragma once

#include <cstddef>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace spillway::kernels {

/// In place on `batch` square [seq, seq] score matrices: row i becomes softmax over columns
/// j <= i; columns j > i become 0.
void causal_softmax_forward(kernel_context& ctx, stream s, float* scores, int batch, int seq);

/// In place: dprobs becomes scale * (d loss / d scores) given the saved probabilities:
/// scale * p_ij (dp_ij - sum_k p_ik dp_ik) for j <= i, 0 above the diagonal.
void causal_softmax_backward(kernel_context& ctx, stream s, const float* probs, float* dprobs,
                             int batch, int seq, float scale);

/// The same on bf16 scores, probabilities and gradients, with the arithmetic in float32 in the
/// same order as the float32 kernels and each result narrowed once: every output is to_bf16 of
/// the float32 kernel's on the widened inputs.
void causal_softmax_forward(kernel_context& ctx, stream s, bf16* scores, int batch, int seq);
void causal_softmax_backward(kernel_context& ctx, stream s, const bf16* probs, bf16* dprobs, int batch, int seq,
                             float scale);

/// Shapes of a causal self-attention. head_size = channels / heads.
struct attention_shape {
  int batch = 0;
  int seq = 0;
  int channels = 0;
  int heads = 0;
};

/// qkv [batch, seq, 3 * channels]: per token q, k and v side by side (the output of one fused
/// QKV linear layer); head h uses columns [h * hs, (h + 1) * hs) of each of q, k, v.
/// out [batch, seq, channels]: the heads side by side, ready for the output projection.
/// probs [batch, heads, seq, seq]: softmax(q k^T / sqrt(hs)) with the causal mask, kept for
/// backward.
void attention_forward(kernel_context& ctx, stream s, const attention_shape& shape, const float* qkv,
                       float* out, float* probs);

/// dqkv [batch, seq, 3 * channels] is overwritten with d loss / d qkv. scratch has the size
/// of probs and is clobbered.
void attention_backward(kernel_context& ctx, stream s, const attention_shape& shape, const float* qkv,
                        const float* probs, const float* dout, float* dqkv, float* scratch);

/// Workspace the bf16 attention_forward and attention_backward of `shape` need bound: their
/// bf16 GEMMs' (gemm_bf16_workspace_bytes; on the cpu backend the float32 copies of one head's
/// operands and result, on the cuda backend none of their own) (Note [Workspace]).
[[nodiscard]] std::size_t attention_bf16_workspace_bytes(const kernel_context& ctx, const attention_shape& shape);

/// bf16 qkv, out, probs, dout, dqkv and scratch: the same composition of bf16 GEMMs (float32
/// sums) and the bf16 causal softmax, each stage's result rounded to bf16 once. On the cpu
/// backend that is bit for bit the float32 kernels run stage by stage on widened inputs with
/// each stage's result rounded to bf16.
void attention_forward(kernel_context& ctx, stream s, const attention_shape& shape, const bf16* qkv, bf16* out,
                       bf16* probs);
void attention_backward(kernel_context& ctx, stream s, const attention_shape& shape, const bf16* qkv,
                        const bf16* probs, const bf16* dout, bf16* dqkv, bf16* scratch);

}  // namespace spillway::kernels
