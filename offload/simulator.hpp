// Simulator: replays a trace and a plan on a hardware profile and reports step time, stalls,
// peak device memory, bytes per direction and tier, every rule the plan breaks, and a timeline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "offload/collective.hpp"
#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "prefetch/layout.hpp"
#include "prefetch/memory_sample.hpp"
#include "prefetch/plan.hpp"
#include "prefetch/trace.hpp"

namespace spillway::offload {

/// recompute: ops run again (Note [Recomputation] in prefetch/plan.hpp); they take the compute
/// stream like any op but are shown on a track of their own. host: ops placed on the host (Note
/// [Host ops] in prefetch/plan.hpp), on the host queue beside the device. network: collectives
/// (Note [Network stream]; id = op index).
enum class sim_track : std::uint8_t { compute, h2d, d2h, nvme_read, nvme_write, recompute, host, network };
inline constexpr int sim_track_count = 8;
std::string_view to_string(sim_track t) noexcept;

/// One interval on one track: an op on compute, recompute, host or network (id = op index), a
/// copy on the others (id = tensor id).
struct sim_event {
  sim_track track = sim_track::compute;
  std::uint32_t id = 0;
  double start = 0;
  double end = 0;
  std::uint64_t bytes = 0;
};

struct sim_options {
  bool record_timeline = false;
  std::size_t max_violations = 16;  ///< messages kept; violation_count counts them all
  /// The collectives of a rank's trace (offload/data_parallel.hpp): their ops run on the
  /// network stream over the profile's network (Note [Network stream]). nullptr: every op
  /// runs on the compute stream, as in a one-process run.
  const comm_schedule* comm = nullptr;
  /// The addresses the executor gives the plan's allocations (prefetch/layout.hpp): each waits
  /// until the tensors before it at its bytes are gone (Note [Addresses in the replay] in
  /// simulator.cpp). nullptr: memory is counted, not placed.
  const device_layout* layout = nullptr;
};

/// Note [Network stream]
/// With sim_options::comm, each op the schedule lists is a collective (Note [Ring collectives]
/// in offload/collective.hpp) on one in-order network queue beside the copy queues. At its place
/// in the trace (after the previous op ends, after that boundary's evictions and prefetches)
/// it is issued: what it reads must be resident as for any op, what it only writes is
/// allocated then, and it starts when the network is free and its reads are ready. It does not
/// hold up the compute stream: a later op waits for it only through a tensor (reading what it
/// writes, writing what it reads), and memory it reads is freed (dropped) only when it ends.
/// A collective moving w wire bytes each way over `ranks` ranks in s steps takes
/// s x network latency + w / network bandwidth on the network, and the traffic crosses the
/// GPU's PCIe link (the NIC reads and writes device memory through it, GPUDirect RDMA): w is
/// queued on the H2D queue and w on the D2H queue from its start, behind the copies issued
/// before it and ahead of those issued after (one copy engine: max of the two on the shared
/// queue, the link being full duplex). It ends when the network part and both link parts are
/// done. An unlimited network (bandwidth infinity) moves the bytes in no time and takes no
/// link time: only the latency is left (none at 0). The step ends when the last collective
/// has ended too. Without a schedule, or for ops it does not list, nothing changes.

/// Note [Simulator model]
/// Three in-order queues serve copies (H2D, D2H; one shared queue when the profile has one
/// copy engine) plus one queue per NVMe direction; the compute queue runs ops in trace order.
/// At the boundary before op k (time the previous op ends): evictions listed after op k-1 are
/// issued (D2H copy, device memory freed when it completes; drop frees at once; a copy to a
/// tier that already holds a valid copy is a drop), then prefetches listed before op k take
/// device memory and queue their copy (from NVMe: read into staging, then H2D). Memory is taken
/// in program order: an allocation that does not fit waits for earlier frees to complete; if it
/// cannot fit even then, the plan breaks the budget (a violation). Then the recomputations
/// listed before op k run on the compute queue in order, each when its reads are resident,
/// allocating what it writes (a read not resident, or one whose value changed since the op
/// first ran, is a violation). Op k starts when its
/// tensors are resident; a tensor it only writes is allocated at its start; one it reads that
/// is neither resident nor prefetched is fetched on demand (a violation and a stall).
/// An op the plan places on the host (Note [Host ops]) takes no compute time and no device
/// memory: it runs on the host queue for its duration (hw_profile::host_op_seconds) once the
/// host op before it in program order has ended, its host-tier inputs are complete and no copy
/// up still reads the old value of what it writes, and the device work after it is issued
/// only when it ends, as the executor runs it (Note [Host ops in the executor] in
/// prefetch/executor_host.cpp): a program that steps its parameters in the order their
/// gradients are done lets the host keep pace with the backward pass. Reading a tensor without a host-tier
/// copy is a violation; what it writes is valid in the host tier from its end, and a device
/// copy of it is stale: reading, copying out or ending the iteration with a stale copy is a
/// violation (dropping it is not). A synchronous step (plan_step::synchronous) first waits for
/// every copy queue, the host queue and the previous op. The step ends when the last op, every copy it started
/// and every host op have finished.
struct sim_result {
  double step_seconds = 0;
  double compute_seconds = 0;    ///< sum of op durations (each op of the trace once)
  double recompute_seconds = 0;  ///< sum of the durations of ops run again
  std::size_t recomputes = 0;    ///< ops run again
  double stall_seconds = 0;      ///< time the compute queue waited (step - compute - recompute)
  double host_seconds = 0;       ///< sum of the durations of ops placed on the host
  std::size_t host_ops = 0;      ///< ops placed on the host
  /// The most bytes held at once on the device, the host tier and the NVMe tier.
  std::uint64_t peak_device_bytes = 0, peak_host_bytes = 0, peak_nvme_bytes = 0;
  /// Bytes moved: over the link each way (h2d, d2h), and read from and written to the NVMe tier.
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0, nvme_read_bytes = 0, nvme_write_bytes = 0;
  /// Collectives run (Note [Network stream]), the time the network queue was busy, and the
  /// bytes this rank sent (as many received).
  std::size_t collectives = 0;
  double network_seconds = 0;
  std::uint64_t network_bytes = 0;
  std::size_t on_demand_fetches = 0;
  std::size_t violation_count = 0;
  std::vector<std::string> violations;  ///< first max_violations messages
  std::vector<sim_event> timeline;      ///< when record_timeline
  std::vector<memory_sample> memory;    ///< when record_timeline (at_us: replay time in µs)
  /// No violations: within budget and tier capacities, every read finds its tensor resident
  /// through the plan, no value lost, the iteration ends in the state it started from.
  [[nodiscard]] bool feasible() const noexcept { return violation_count == 0; }
};

sim_result simulate(const trace& t, const plan& p, const hw_profile& hw, const sim_options& opt = {});
/// The same with the trace already analyzed (`r` must be analyze(t)): planners that simulate
/// many candidates skip the analysis each time.
sim_result simulate(const trace& t, const lifetime_report& r, const plan& p, const hw_profile& hw,
                    const sim_options& opt = {});

/// Reference times a plan cannot beat, recomputing or not: compute alone (ideal), the model
/// state's transfers (state bound) and the largest of the volume, order and memory-window
/// bounds; the proofs are Note [Lower bound] in simulator_bounds.cpp and Note [Memory windows]
/// in bound_window.cpp.
struct bounds {
  double ideal_seconds = 0;
  double lower_bound_seconds = 0;  ///< largest of ideal, state, volume, order and window bounds
  /// The least step the model state alone allows: the per-use transfer bound with every
  /// transient value free to drop and make again (only parameters, gradients and optimizer
  /// state that do not fit cost link time), at least ideal_seconds.
  double state_bound_seconds = 0;
  /// Least bytes per iteration over the link each way and from/to NVMe, counted per use
  /// (Note [Per-use transfer bound] in bound_transfer.cpp).
  std::uint64_t h2d_min_bytes = 0;
  std::uint64_t d2h_min_bytes = 0;
  std::uint64_t nvme_read_min_bytes = 0;
  std::uint64_t nvme_write_min_bytes = 0;
  double volume_bound_seconds = 0;  ///< family (1): those bytes at the link's and NVMe's speeds
  double order_bound_seconds = 0;   ///< family (2)
  op_index order_bound_op = 0;      ///< the op j that gives family (2)
  double window_bound_seconds = 0;  ///< family (3): Note [Memory windows] in bound_window.cpp
  op_index window_bound_op = 0;     ///< the op that ends its longest window (0: none)
};
bounds compute_bounds(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget);

}  // namespace spillway::offload
