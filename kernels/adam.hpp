// Adam with bias correction (and optional decoupled weight decay, as AdamW), one step over a
// flat float32 parameter buffer; the update is the shared SPILLWAY_HD body ops::adam_update.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {

struct adam_config {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  ///< decoupled: p -= lr * weight_decay * p (0 is plain Adam)
};

/// One step: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t))
/// + eps) + wd p). `step` counts from 1. m and v start as zeros.
void adam_step(kernel_context& ctx, stream s, float* params, const float* grads, float* m, float* v,
               std::size_t n, const adam_config& config, std::int64_t step);

/// The per-step coefficients every Adam runs with (adam_step on both backends, cpu_adam_step):
/// the config plus the bias corrections 1 - beta^step, worked out once on the host (in double,
/// rounded to float), so every Adam sees the same bits. Checks the arguments as adam_step does
/// (usage_error naming `kernel`): step counts from 1, betas in [0, 1), eps >= 0.
[[nodiscard]] ops::adam_coeffs make_adam_coeffs(const adam_config& config, std::int64_t step,
                                                const char* kernel = "make_adam_coeffs");

/// Mixed precision: the same step on fp32 master weights with a bf16 gradient (widened exactly),
/// then weights = to_bf16(master) (round to nearest even). Master and moments stay fp32, so the
/// master's bits equal the fp32 step's on the widened gradient.
void adam_step(kernel_context& ctx, stream s, float* master, const bf16* grads, float* m, float* v, bf16* weights,
               std::size_t n, const adam_config& config, std::int64_t step);

}  // namespace spillway::kernels
