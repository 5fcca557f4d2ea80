// Simulator: replays a trace and a plan on a hardware profile and reports step time, stalls,
// peak device memory, bytes per direction and tier, every rule the plan breaks, and a timeline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "prefetch/memory_sample.hpp"
#include "prefetch/plan.hpp"
#include "prefetch/trace.hpp"

namespace spillway::offload {

enum class sim_track : std::uint8_t { compute, h2d, d2h, nvme_read, nvme_write };
std::string_view to_string(sim_track t) noexcept;

/// One interval on one track: an op on compute (id = op index), a copy on the others
/// (id = tensor id).
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
};

/// Note [Simulator model]
/// Three in-order queues serve copies (H2D, D2H; one shared queue when the profile has one
/// copy engine) plus one queue per NVMe direction; the compute queue runs ops in trace order.
/// At the boundary before op k (time the previous op ends): evictions listed after op k-1 are
/// issued (D2H copy, device memory freed when it completes; drop frees at once; a copy to a
/// tier that already holds a valid copy is a drop), then prefetches listed before op k take
/// device memory and queue their copy (from NVMe: read into staging, then H2D). Memory is taken
/// in program order: an allocation that does not fit waits for earlier frees to complete; if it
/// cannot fit even then, the plan breaks the budget (a violation). Op k starts when its
/// tensors are resident; a tensor it only writes is allocated at its start; one it reads that
/// is neither resident nor prefetched is fetched on demand (a violation and a stall). The step
/// ends when the last op and every copy it started have finished.
struct sim_result {
  double step_seconds = 0;
  double compute_seconds = 0;  ///< sum of op durations
  double stall_seconds = 0;    ///< time the compute queue waited (step - compute)
  std::uint64_t peak_device_bytes = 0;
  std::uint64_t peak_host_bytes = 0;
  std::uint64_t peak_nvme_bytes = 0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::uint64_t nvme_read_bytes = 0;
  std::uint64_t nvme_write_bytes = 0;
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

/// Note [Lower bound]
/// Let B be the budget and, for op j, N_j the needed bytes (Note [Live and needed bytes]) and
/// W_j those of tensors the iteration writes. Two families of bounds; lower_bound is the
/// largest of them and of compute time.
/// (1) Volume. While op j runs at least N_j - B needed bytes are off the device, and each must
///     cross the link back before its next read: once per iteration in steady state, so
///     H2D >= max_j (N_j - B). Of them at least W_j - B hold a value written by an iteration,
///     which had to be copied out: D2H >= max_j (W_j - B). What the host tier cannot hold sits
///     on NVMe: NVMe reads >= max_j (N_j - B - host), writes >= max_j (W_j - B - host).
///     Time >= max(H2D/h2d_bw, D2H/d2h_bw, NVMe_r/nvme_r_bw, NVMe_w/nvme_w_bw), with the H2D
///     and D2H terms added when the profile has one copy engine.
/// (2) Order around one op. Fix op j, running over [s_j, e_j], and an instant tau in it. The
///     device holds the working set S_j of op j all that time, and at most B bytes in all, so
///     at tau at least K_j = N_j - B bytes of needed tensors that op j does not touch are not
///     allocated ("off"). Take such a tensor x. Its memory was freed before tau; it is taken
///     again only after tau (a prefetch or an allocation takes memory at one instant, program
///     order), and its copy in starts after that. So:
///     (a) if its next use is in this iteration (at op r; it reads x, x being needed), an H2D
///         of x runs after tau and ends before s_r, after which ops r.. still run: T >= tau +
///         (bytes of such x with r <= k)/h2d_bw + F_k for every k, with F_k the compute of
///         ops k..n-1. If its next read is in the next iteration, nothing is owed here (0).
///     (b) if this iteration wrote x before j (last at op w), that value exists only on the
///         device until copied out, and it is needed later, so a D2H of it ran after e_w (the
///         eviction is issued at an op boundary >= e_w) and ended before tau: the D2H queue
///         starts at 0 and serves one copy at a time, so tau >= E_w' + (bytes of such x with
///         w >= w')/d2h_bw for every w', with E_w' the compute of ops 0..w'. Otherwise
///         nothing is owed here (0).
///     Which tensors are off is the plan's choice; the bound takes for each side separately the
///     choice of K_j bytes that costs least there (a sum of two minima is at most the minimum
///     of the sum): for (b), first the ones that owe nothing, then the earliest written; for
///     (a), first the ones that owe nothing, then the latest read (for a fixed amount these
///     sets make every term of the max smallest at once; the last one counts in part, which
///     only lowers the bound). With D_j and H_j those two least values:
///       tau = s_j:  T >= max(C_<j, D_j) + max(dur(j) + C_>j, H_j)
///       tau -> e_j: T >= max(C_<=j, D_j) + max(C_>j, H_j)
///     (C_<j, C_<=j, C_>j: compute before, through and after op j; s_j >= C_<j, e_j >= C_<=j.)
///     The H2D of (a) may start during op j (an allocation made when op j has already
///     started), which is why dur(j) is not added to both sides.
///     (c) Late copies out. Among the tensors (b) lets off for free, take those the iteration
///         writes again after op j (last at op w_x) and the next iteration reads. If such an x
///         is off at tau and no D2H of it ran before tau in this iteration, it did not start
///         the iteration on the device (freeing it there needs a copy out: no tier holds its
///         value), so it started in a tier and must end there with its final value: a D2H
///         after e_{w_x}. So each is either "pre" (a D2H before tau, which starts after op 0
///         ends, as every eviction follows an op) or "late". With L the late bytes, for every
///         op k after j: T >= tau + (bytes off at tau read at ops <= k)/h2d_bw +
///         max(F_k, dur(k) + (late bytes with w_x >= k)/d2h_bw), their copies out starting
///         after e_{w_x} >= e_k = s_k + dur(k). For a given amount L the least pre side
///         D(L) (the untouched tensors that owe nothing first, then pre bytes, then the
///         earliest written of (b)) falls as L grows and the least late side H'(L) (latest
///         read first for the copies in, earliest last write first for the late ones) grows;
///         on a grid L_0 = 0 < ... < L_G = all such bytes, every L in [L_i, L_i+1] gives at
///         least max(C_<j, D(L_i+1)) + max(dur(j) + C_>j, H'(L_i)) (and the form at e_j), so
///         the least of these over i is a bound.
/// Both ignore latency and every other dependency, so no plan beats them. ideal is compute
/// alone (unlimited memory).
struct bounds {
  double ideal_seconds = 0;
  double lower_bound_seconds = 0;
  std::uint64_t h2d_min_bytes = 0;
  std::uint64_t d2h_min_bytes = 0;
  std::uint64_t nvme_read_min_bytes = 0;
  std::uint64_t nvme_write_min_bytes = 0;
  double volume_bound_seconds = 0;  ///< family (1)
  double order_bound_seconds = 0;   ///< family (2)
  op_index order_bound_op = 0;      ///< the op j that gives family (2)
};
bounds compute_bounds(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget);

}  // namespace spillway::offload
