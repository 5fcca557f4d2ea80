// Helpers the launchers share: enqueueing cpu work on a stream, a fixed-partition parallel
// loop, and the argument checks every kernel makes before it enqueues anything.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "device/error.hpp"
#include "kernels/context.hpp"

namespace spillway::kernels::detail {

/// Enqueues cpu work that stands for a kernel (cpu backend): Device::launch_kernel runs it on
/// the stream's own worker, as a GPU runs a kernel on its stream. Never launch_host: host
/// functions share one callback thread and are for short notifications, not compute.
template <class F>
void enqueue_cpu(kernel_context& ctx, stream s, F&& work) {
  ctx.device().launch_kernel(s, std::function<void()>(std::forward<F>(work)));
}

/// Queues on s, after the kernels that write `report`, a host function that reads the slot, frees
/// it, and calls check(first, second) with the two values, which throws the launch's usage_error
/// (Note [Reports from kernels]). Where the host function cannot be queued the slot stays taken:
/// a kernel already queued may still write it.
template <class Check>
void check_report(kernel_context& ctx, stream s, kernel_report report, Check check) {
  ctx.device().launch_host(s, [report, check] {
    const std::int32_t first = report.host[0];
    const std::int32_t second = report.host[1];
    report.busy->store(false, std::memory_order_release);
    check(first, second);
  });
}

/// The cuda dispatch of a kernel that reports (Note [Reports from kernels]): takes a report slot,
/// runs launch(slot's device address), whose last launch writes the slot, then queues the host
/// function that reads it and calls check(first, second). Where `launch` throws, its report
/// kernel was not launched (it is the last), so the slot is freed again.
template <class Launch, class Check>
void launch_with_report(kernel_context& ctx, stream s, Launch launch, Check check) {
  const kernel_report report = ctx.take_report();
  try {
    launch(report.device);
  } catch (...) {
    report.busy->store(false, std::memory_order_release);
    throw;
  }
  check_report(ctx, s, report, std::move(check));
}

/// Runs body(begin, end) over [0, n) in chunks of `grain` with a static partition. Each index
/// is handled by exactly one call, so as long as outputs of different indices are independent
/// the result does not depend on which thread ran what (Note [Deterministic kernels]).
template <class F>
void parallel_for(std::size_t n, std::size_t grain, const F& body) {
  if (n == 0) return;
  if (n <= grain) {
    body(std::size_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                    [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); },
                    tbb::simple_partitioner());
}

/// Grain that gives a chunk roughly `work_per_chunk` units of work when each index costs `cost`.
inline std::size_t grain_for(std::size_t cost, std::size_t work_per_chunk = 1u << 15) {
  const std::size_t g = work_per_chunk / (cost == 0 ? 1 : cost);
  return g == 0 ? 1 : g;
}

}  // namespace spillway::kernels::detail

/// Checks a launch argument; a false one is a misuse of the kernel: usage_error naming the kernel
/// and the condition the arguments broke.
#define SPILLWAY_KERNEL_EXPECTS(cond, kernel) \
  SPILLWAY_EXPECTS_T(::spillway::usage_error, cond, std::string(kernel) + ": bad argument, needs " #cond)

/// The one dispatch of a kernel, after its checks: `cuda_call` (its launcher, cuda_launchers.hpp)
/// on the cuda backend of a CUDA build, else the cpu work (the rest of the arguments) enqueued on
/// s. A macro so that a build without CUDA never names a launcher it does not define.
#if SPILLWAY_HAVE_CUDA
#define SPILLWAY_KERNEL_LAUNCH(ctx, s, cuda_call, ...)                       \
  ((ctx).is_cuda() ? static_cast<void>(cuda_call)                             \
                   : ::spillway::kernels::detail::enqueue_cpu((ctx), (s), __VA_ARGS__))
#else
#define SPILLWAY_KERNEL_LAUNCH(ctx, s, cuda_call, ...) \
  ::spillway::kernels::detail::enqueue_cpu((ctx), (s), __VA_ARGS__)
#endif
