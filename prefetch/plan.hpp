// Plan: what the executor does at each op boundary (swap-outs after an op, prefetches before
// one) and where each persistent tensor lives when the iteration starts. Produced by every planner.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "prefetch/trace.hpp"
#include "swap/tier.hpp"

namespace spillway {

/// Where a copy of a tensor lives: `tier` from swap/tier.hpp (to_string(tier) names it there).
[[nodiscard]] std::string_view tier_name(tier t) noexcept;
[[nodiscard]] std::optional<tier> parse_tier(std::string_view s) noexcept;

/// What happens to a tensor's device copy after an op.
///  - evict_to_host / evict_to_nvme: copy device -> tier, then free the device memory once the
///    copy is complete (to NVMe the bytes go through a pinned host staging buffer).
///  - drop: free the device memory at once, without a copy. Legal only when the contents are
///    dead (a transient after its last use, or a tensor whose next use overwrites it without
///    reading) or a valid copy already exists in a tier (an unchanged persistent tensor). The
///    executor keeps the value of a parameter or optimizer state whose next use overwrites it
///    (a copy out in place of the drop): an iteration that departs from the trace may read it
///    first. Only a gradient's value is ever dropped as dead.
enum class evict_action : std::uint8_t { evict_to_host, evict_to_nvme, drop };
[[nodiscard]] std::string_view to_string(evict_action a) noexcept;
[[nodiscard]] std::optional<evict_action> parse_evict_action(std::string_view s) noexcept;

struct eviction {
  tensor_id tensor = 0;
  evict_action action = evict_action::drop;
};

/// A copy tier -> device issued before op `issue` (listed in steps[issue].prefetches) so that
/// the tensor is resident for op `use` (use >= issue). Device memory is taken when it is issued.
struct prefetch {
  tensor_id tensor = 0;
  tier from = tier::host;  ///< host or nvme, never device
  op_index use = 0;
};

/// Note [Recomputation]
/// An op the trace marks recomputable (op_desc::recomputable) may be run again before a later
/// op k: steps[k].recomputes lists such ops, run in list order after the step's prefetches are
/// issued and before op k itself. A rerun of op o reads o's reads, which must then be resident
/// and hold the values they held when o ran (no op between o and k wrote them; an earlier entry
/// of the same list may have recomputed them: chains), and writes o's writes again, allocating
/// those not resident, with the very bits o wrote. So a plan may drop, without a copy, a value
/// a recomputable op wrote, as long as it reruns that op before the value's next read. What a
/// rerun writes is an ordinary resident tensor afterwards: the plan evicts or drops it like any
/// other (a value only a later entry needed is dropped after op k). A chain may be spread over
/// several steps: a rerun before op j makes a value that a rerun before a later op reads; one
/// the program has released is kept until then (Note [Rerun temps across steps] in
/// recompute.hpp). The time a rerun takes is spent on the compute stream.

/// Note [Host ops]
/// An op the trace marks host_capable (op_desc::host_capable; the zoo's optimizer steps) may be
/// placed on the host: plan_step::on_host. It then reads and writes the host-tier copies of its
/// tensors, never their device copies, and takes no device memory:
///  - every tensor it reads must have a valid host-tier copy when it starts (a gradient the
///    backward pass wrote is evicted to the host after its last device write: in a mixed-
///    precision trace that copy moves the 16-bit gradient, 2 bytes per parameter);
///  - what it writes is valid in the host tier only from its end; a device copy of such a tensor
///    is stale from then on and must be dropped, not read or copied out; a device op that reads
///    it later gets it by a prefetch from the host (the 16-bit weights, 2 bytes per parameter);
///  - tensors only host ops touch (fp32 master weights, Adam moments) start and end in the host
///    tier and never cross the link.
/// Host ops run in one host queue beside the device's compute stream, in program order: each
/// starts when the host op before it has ended and the host copies it reads are complete (and
/// no copy still reads the old value of what it writes), so it overlaps device work issued
/// before it; device work after it is issued when it ends. A program that steps each
/// parameter once its gradient is done (the zoo's traces do) keeps the host in step with the
/// backward pass. Its cost is host_bytes / host memory bandwidth,
/// or host_flops / (cores x vector width x clock) when that is larger (offload/profile.hpp).
/// A step may be synchronous (plan_step::synchronous): the op waits for everything issued before
/// it. Baselines that model a framework's synchronous optimizer step use it (zero-offload: the
/// host step after the whole backward pass, the next forward pass after every 16-bit weight is
/// back, as DeepSpeed runs ZeRO-Offload).
/// The executor runs such a step on the thread that issues the iteration (Note [Host ops in the
/// executor] in prefetch/executor_host.cpp), with the host body the program gave the op
/// (Session::host_capable_op).

/// Everything the executor does around op k: prefetches issued before it starts, then the
/// recomputations (Note [Recomputation]), then the op, then evictions issued after it finishes
/// (in list order).
struct plan_step {
  std::vector<prefetch> prefetches;
  std::vector<op_index> recomputes;  ///< earlier recomputable ops run again before this one
  std::vector<eviction> evictions;
  bool on_host = false;  ///< op k runs on the host (Note [Host ops]); only for host_capable ops
  /// Op k starts only when everything issued before it has finished: earlier ops, on the
  /// device and on the host, and every copy, this step's prefetches included (Note [Host ops]).
  bool synchronous = false;
};

/// One iteration's plan. steps.size() == trace.ops.size(). A tensor an op touches that is not
/// resident and has no prefetch is fetched on demand by the executor (a stall). A tensor an op
/// only writes needs no prefetch: the executor allocates it when the op starts.
/// Persistent tensors whose value crosses the iteration boundary start in initial_tier and must
/// be back there when the iteration ends (device: resident; host/nvme: a valid copy there and
/// not resident), so that iterations chain. Transient tensors start and end unallocated.
struct plan {
  std::string policy;               ///< planner that produced it ("none", "lms", "vdnn-all", ...)
  std::uint64_t budget_bytes = 0;   ///< device budget it was made for
  std::vector<tier> initial_tier;   ///< per tensor; tier::device for transients
  std::vector<plan_step> steps;     ///< per op

  /// An empty plan for `t`: everything starts on the device, no copies.
  static plan empty_for(const trace& t, std::string policy, std::uint64_t budget);
  /// Structural checks (sizes match, ids in range, prefetch use >= issue, from != device, a
  /// recomputation names an earlier op the trace marks recomputable, an op on the host is one
  /// the trace marks host_capable and is not recomputed);
  /// throws usage_error (a plan made for another trace) naming the op and entry. Memory and timing are the simulator's job.
  void validate(const trace& t) const;
  [[nodiscard]] std::size_t eviction_count() const noexcept;
  [[nodiscard]] std::size_t prefetch_count() const noexcept;
  [[nodiscard]] std::size_t recompute_count() const noexcept;
  /// Ops placed on the host (Note [Host ops]).
  [[nodiscard]] std::size_t host_op_count() const noexcept;
};

}  // namespace spillway
