// The CPU Adam: one synchronous Adam step over host memory, vectorised (AVX2, AVX-512) and
// parallel, equal bit for bit to adam_step on either backend (Note [Exact math]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/adam.hpp"

namespace spillway::kernels {

/// Instruction sets the CPU Adam has a body for. `best` is the widest this CPU supports.
enum class cpu_isa { scalar, avx2, avx512, best };

/// "scalar", "avx2", "avx512", "best".
[[nodiscard]] std::string_view to_string(cpu_isa isa);
/// The inverse of to_string; nullopt for any other word.
[[nodiscard]] std::optional<cpu_isa> parse_cpu_isa(std::string_view word);
/// Whether this CPU (and its operating system) can run `isa`; scalar and best always can.
/// AVX-512 means AVX-512F.
[[nodiscard]] bool cpu_supports(cpu_isa isa);
/// The widest instruction set this CPU supports (never `best`).
[[nodiscard]] cpu_isa best_cpu_isa();

/// One Adam step over n parameters in host memory, with the update of adam_step (same
/// config, same step numbering, same bits): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= lr (m_hat / (sqrt(v_hat) + eps) + wd p). Synchronous; runs on the calling thread and
/// oneTBB's workers, in the partition of kernels/host_parallel.hpp (so numa_array buffers are
/// updated where they were first touched). `isa` picks the body; asking for one this CPU lacks
/// is a usage_error, as are step < 1, bad betas and null buffers. Buffers need no alignment.
void cpu_adam_step(float* params, const float* grads, float* m, float* v, std::size_t n,
                   const adam_config& config, std::int64_t step, cpu_isa isa = cpu_isa::best);

/// Mixed precision (the optimizer of a bf16 model placed on the host): the same step on fp32
/// master weights with bf16 gradients, widened exactly, then weights = to_bf16(master) (round to
/// nearest even, NaN made quiet), as the mixed adam_step on either backend does, bit for bit.
void cpu_adam_step(float* master, const bf16* grads, float* m, float* v, bf16* weights, std::size_t n,
                   const adam_config& config, std::int64_t step, cpu_isa isa = cpu_isa::best);

namespace detail {
// The bodies over [0, n) of one chunk, each ending in the scalar ops::adam_update for the tail
// (cpu_adam_isa.cpp). The AVX ones run only where cpu_supports says so.
void cpu_adam_scalar(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c);
void cpu_adam_avx2(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c);
void cpu_adam_avx512(float* p, const float* g, float* m, float* v, std::size_t n, const ops::adam_coeffs& c);
void cpu_adam_mixed_scalar(float* p, const bf16* g, float* m, float* v, bf16* w, std::size_t n,
                           const ops::adam_coeffs& c);
void cpu_adam_mixed_avx2(float* p, const bf16* g, float* m, float* v, bf16* w, std::size_t n,
                         const ops::adam_coeffs& c);
void cpu_adam_mixed_avx512(float* p, const bf16* g, float* m, float* v, bf16* w, std::size_t n,
                           const ops::adam_coeffs& c);
}  // namespace detail

}  // namespace spillway::kernels
