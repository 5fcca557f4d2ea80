// The measurement behind `spillway-bench adam`: Adam steps and triad passes taking turns over
// NUMA-placed buffers of the same total size, with oneTBB's threads and the same partition.
#include "bench/adam_measure.hpp"

#include <tbb/task_arena.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <string>

#include "device/error.hpp"
#include "kernels/host_parallel.hpp"
#include "kernels/numa_array.hpp"

namespace spillway::bench {
namespace {

using clk = std::chrono::steady_clock;

template <class F>
double seconds_of(const F& f) {
  const auto t0 = clk::now();
  f();
  return std::chrono::duration<double>(clk::now() - t0).count();
}

// a = b + s c over [begin, end), SSE (every x86-64 has it): wide enough for a loop that waits
// on memory, and the same on every machine.
void triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s, std::size_t begin,
           std::size_t end) {
  std::size_t i = begin;
#if defined(__x86_64__)
  const __m128 sv = _mm_set1_ps(s);
  for (; i + 4 <= end; i += 4)
    _mm_storeu_ps(a + i, _mm_add_ps(_mm_loadu_ps(b + i), _mm_mul_ps(sv, _mm_loadu_ps(c + i))));
#endif
  for (; i < end; ++i) a[i] = b[i] + s * c[i];
}

}  // namespace

adam_measure_result measure_adam_against_triad(const adam_measure_options& o) {
  SPILLWAY_EXPECTS_T(usage_error, o.elements > 0, "spillway-bench adam: needs at least one element");
  SPILLWAY_EXPECTS_T(usage_error, o.repeats > 0, "spillway-bench adam: needs at least one repeat");
  SPILLWAY_EXPECTS_T(usage_error, kernels::cpu_supports(o.isa),
                     "spillway-bench adam: this CPU cannot run " + std::string(kernels::to_string(o.isa)));
  adam_measure_result r;
  r.elements = o.elements;
  r.repeats = o.repeats;
  r.isa = o.isa == kernels::cpu_isa::best ? kernels::best_cpu_isa() : o.isa;
  r.threads = tbb::this_task_arena::max_concurrency();
  // 16 bytes of Adam state per parameter; the triad's three buffers share the same bytes.
  r.triad_elements = (4 * o.elements + 2) / 3;

  const std::size_t n = o.elements;
  kernels::numa_array<float> p(n), g(n), m(n), v(n);
  kernels::numa_array<float> a(r.triad_elements), b(r.triad_elements), c(r.triad_elements);
  r.numa_placed = p.numa_placed();
  kernels::detail::for_each_host_chunk(n, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      g[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001u) - 1000) * 1e-3f;
      p[i] = 0.5f * g[i];
    }
  });
  kernels::detail::for_each_host_chunk(r.triad_elements, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) b[i] = c[i] = static_cast<float>(i % 1000) * 1e-3f;
  });

  kernels::adam_config config;
  config.weight_decay = 0.01f;
  r.adam_seconds = r.triad_seconds = 1e30;
  std::int64_t step = 0;
  for (int turn = 0; turn <= o.repeats; ++turn) {  // turn 0 warms up and is not counted
    const double ta = seconds_of([&] {
      kernels::cpu_adam_step(p.data(), g.data(), m.data(), v.data(), n, config, ++step, r.isa);
    });
    const double tt = seconds_of([&] {
      kernels::detail::for_each_host_chunk(r.triad_elements, [&](std::size_t lo, std::size_t hi) {
        triad(a.data(), b.data(), c.data(), 3.0f, lo, hi);
      });
    });
    if (turn == 0) continue;
    r.adam_seconds = std::min(r.adam_seconds, ta);
    r.triad_seconds = std::min(r.triad_seconds, tt);
  }
  return r;
}

}  // namespace spillway::bench
