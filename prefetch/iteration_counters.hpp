// What one iteration moved and how it went against its plan. The executor counts them
// (executor_stats) and the Session hands them to users as they are (iteration_report), so the
// fields are declared once, here. Header only (plan types).
#pragma once

#include <cstdint>

namespace spillway {

struct iteration_counters {
  /// Time ops waited for tensors that were not there in time: the device's compute waiting for
  /// copies, and the calling thread's waits for room or for on-demand moves. Not a host op's
  /// wait for the device work that makes its inputs (host_op_wait_ms): the device is busy then.
  double stall_ms = 0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::uint64_t nvme_read_bytes = 0;
  std::uint64_t nvme_write_bytes = 0;
  std::uint64_t peak_device_bytes = 0;       ///< device memory in use at the worst moment (bytes of tensors held at once)
  /// The most scratch one op held at once beside its tensors (executor::scratch and begin_op's
  /// buffers, each as placed): memory no plan counts, which the plan leaves room for (Note
  /// [Headroom] in allocator/device_budget.hpp).
  std::uint64_t op_scratch_peak_bytes = 0;
  std::uint64_t on_demand_fetches = 0;       ///< tensors fetched because the plan missed them
  std::uint64_t on_demand_evictions = 0;     ///< tensors evicted because an allocation would exceed the budget
  std::uint64_t prefetches_deferred = 0;     ///< planned prefetches that found no room at their op
  std::uint64_t fragmented_allocations = 0;  ///< allocations the allocator refused with budget left (fragments)
  bool layout = false;                       ///< device addresses came from a packed layout of the plan (prefetch/layout.hpp)
  std::uint64_t layout_misses = 0;           ///< allocations with no planned address, or with it taken (the run left the plan)
  std::uint64_t recomputes = 0;              ///< ops run again before a later op (Note [Recomputation] in plan.hpp)
  std::uint64_t host_ops = 0;                ///< ops the plan ran on the host (Note [Host ops] in plan.hpp)
  double host_op_ms = 0;                     ///< SUM of their wall times, on the thread that ran them
  /// SUM of the time host ops waited, before they ran, for their inputs' host copies (the device
  /// work that writes them and the copies out), on the thread that ran them.
  double host_op_wait_ms = 0;
};

}  // namespace spillway
