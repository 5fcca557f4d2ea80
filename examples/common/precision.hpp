// The examples' number format: fp32 everywhere, or bf16 mixed precision (Note [Mixed precision]).
#pragma once

#include <cstdint>
#include <string>

namespace spillway::examples {

// Note [Mixed precision]
// With --precision bf16 the tensors the forward and backward passes touch are bf16: weights,
// activations and gradients (the layer norms' saved mean and rstd and the loss stay fp32, being
// statistics). Each parameter also has an fp32 master copy, a persistent tensor of its own beside
// Adam's two fp32 moments; the plan places all three wherever it places optimizer state. The
// Adam op reads the master, the bf16 gradient and the moments, updates the master and moments in
// fp32 and writes the bf16 weights rounded from the new master (kernels/bf16.hpp), so the bf16
// copy is made by whoever holds the master. Every kernel keeps its fixed order of sums in bf16
// too, so losses are identical across policies and budgets, as in fp32 (not equal to fp32's).
enum class precision { fp32, bf16 };

[[nodiscard]] const char* to_string(precision p) noexcept;
/// Parses "fp32" or "bf16"; config_error quoting the text and naming the choices.
[[nodiscard]] precision parse_precision(const std::string& text);
/// Bytes of one weight, activation or gradient element in this precision.
[[nodiscard]] constexpr std::uint64_t element_bytes(precision p) noexcept { return p == precision::bf16 ? 2 : 4; }

}  // namespace spillway::examples
