// The CPU Adam's dispatch: argument checks, the coefficients adam_step uses (make_adam_coeffs),
// the instruction set picked at run time, and the parallel loop over host chunks.
#include "kernels/cpu_adam.hpp"

#include <string>

#include "kernels/host_parallel.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {

std::string_view to_string(cpu_isa isa) {
  switch (isa) {
    case cpu_isa::scalar: return "scalar";
    case cpu_isa::avx2: return "avx2";
    case cpu_isa::avx512: return "avx512";
    case cpu_isa::best: return "best";
  }
  return "?";
}

std::optional<cpu_isa> parse_cpu_isa(std::string_view word) {
  for (cpu_isa isa : {cpu_isa::scalar, cpu_isa::avx2, cpu_isa::avx512, cpu_isa::best})
    if (word == to_string(isa)) return isa;
  return std::nullopt;
}

bool cpu_supports(cpu_isa isa) {
  switch (isa) {
    case cpu_isa::scalar:
    case cpu_isa::best: return true;
#if defined(__x86_64__) || defined(__i386__)
    // libgcc's check also asks the operating system whether it saves the wide registers.
    case cpu_isa::avx2: return __builtin_cpu_supports("avx2") != 0;
    case cpu_isa::avx512: return __builtin_cpu_supports("avx512f") != 0;
#else
    case cpu_isa::avx2:
    case cpu_isa::avx512: return false;
#endif
  }
  return false;
}

cpu_isa best_cpu_isa() {
  if (cpu_supports(cpu_isa::avx512)) return cpu_isa::avx512;
  if (cpu_supports(cpu_isa::avx2)) return cpu_isa::avx2;
  return cpu_isa::scalar;
}

namespace {

/// The checks both CPU Adams make, and the body's instruction set (best resolved).
cpu_isa checked_isa(cpu_isa isa, const char* kernel) {
  SPILLWAY_EXPECTS_T(usage_error, cpu_supports(isa),
                     std::string(kernel) + ": this CPU cannot run the " + std::string(to_string(isa)) +
                         " body (ask for cpu_isa::best, or one cpu_supports accepts)");
  return isa == cpu_isa::best ? best_cpu_isa() : isa;
}

}  // namespace

void cpu_adam_step(float* params, const float* grads, float* m, float* v, std::size_t n,
                   const adam_config& config, std::int64_t step, cpu_isa isa) {
  const ops::adam_coeffs c = make_adam_coeffs(config, step, "cpu_adam_step");
  isa = checked_isa(isa, "cpu_adam_step");
  if (n == 0) return;
  SPILLWAY_KERNEL_EXPECTS(params != nullptr && grads != nullptr && m != nullptr && v != nullptr,
                          "cpu_adam_step: buffers must not be null");
  using body_fn = void (*)(float*, const float*, float*, float*, std::size_t, const ops::adam_coeffs&);
  const body_fn body = isa == cpu_isa::avx512 ? detail::cpu_adam_avx512
                       : isa == cpu_isa::avx2 ? detail::cpu_adam_avx2
                                              : detail::cpu_adam_scalar;
  detail::for_each_host_chunk(n, [&](std::size_t b, std::size_t e) {
    body(params + b, grads + b, m + b, v + b, e - b, c);
  });
}

void cpu_adam_step(float* master, const bf16* grads, float* m, float* v, bf16* weights, std::size_t n,
                   const adam_config& config, std::int64_t step, cpu_isa isa) {
  const ops::adam_coeffs c = make_adam_coeffs(config, step, "cpu_adam_step (bf16)");
  isa = checked_isa(isa, "cpu_adam_step (bf16)");
  if (n == 0) return;
  SPILLWAY_KERNEL_EXPECTS(master != nullptr && grads != nullptr && m != nullptr && v != nullptr && weights != nullptr,
                          "cpu_adam_step (bf16): buffers must not be null");
  using body_fn = void (*)(float*, const bf16*, float*, float*, bf16*, std::size_t, const ops::adam_coeffs&);
  const body_fn body = isa == cpu_isa::avx512 ? detail::cpu_adam_mixed_avx512
                       : isa == cpu_isa::avx2 ? detail::cpu_adam_mixed_avx2
                                              : detail::cpu_adam_mixed_scalar;
  detail::for_each_host_chunk(n, [&](std::size_t b, std::size_t e) {
    body(master + b, grads + b, m + b, v + b, weights + b, e - b, c);
  });
}

}  // namespace spillway::kernels
