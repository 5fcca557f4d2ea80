// Planning with ops on the host (Note [Host placement]): which host_capable ops a plan may put
// on the host, the device view of a trace with them taken out, and the plan for the real trace
// made from a plan for that view; the zero-offload baseline.
#pragma once

#include <functional>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "offload/planner.hpp"
#include "offload/simulator.hpp"

namespace spillway::offload::detail {

/// The trace as the device sees it when the ops in `on_host` run on the host: those ops keep
/// their place but touch no tensor and take no time, so any device planner can plan it.
struct device_view {
  trace t;
  lifetime_report r;
  std::vector<char> on_host;  ///< per op
};

/// The largest subset of `wanted` (per op, host_capable ops only) that host placement can
/// serve: every tensor one of its ops shares with a device op is used on the device only
/// before every host use in the iteration (Note [Host placement]).
std::vector<char> placeable_on_host(const trace& t, const lifetime_report& r, std::vector<char> wanted);
/// Every host_capable op of `t` that can be placed (all false when the profile runs no host ops).
std::vector<char> all_host_ops(const trace& t, const lifetime_report& r, const hw_profile& hw);
/// The host_capable ops whose run on the host is cheaper than the round trip of the state only
/// they touch over the link, placeable.
std::vector<char> cheaper_host_ops(const trace& t, const lifetime_report& r, const hw_profile& hw);

device_view make_device_view(const trace& t, const std::vector<char>& on_host);
/// The plan for `t` from plan `pv` for the view `v`: the ops placed on the host, the tensors
/// only they touch in the host tier all along, the shared ones homed in the host tier, brought
/// up before their first device use and copied down (or dropped) after their last. The copies
/// up at op 0 go in the order of their first use.
/// `params_up_front`: prefetch every shared value the device reads first at op 0 (resident
/// from the start of the step, as ZeRO-Offload keeps its 16-bit parameters).
plan plan_from_view(const trace& t, const lifetime_report& r, const device_view& v, const plan& pv, std::string policy,
                    bool params_up_front = false);

/// zero-offload: ZeRO-Offload (Ren et al., USENIX ATC 2021) as DeepSpeed configures it: every
/// optimizer step on the host, its fp32 master weights and Adam moments in the host tier, the
/// 16-bit parameters resident on the device, activations checkpointed per layer and recomputed
/// (the checkpoint planner on the device view); its steps synchronous as DeepSpeed runs them
/// (each host step after the backward pass, op 0 after every 16-bit weight is up: no one-step
/// delayed update). Where the profile runs no host ops or the trace has none, the checkpoint plan.
std::unique_ptr<planner> make_zero_offload_planner(const planner_options& opt);

/// Every placeable host_capable op on the host, whatever the device planner (a Session's setting
/// host_ops = host): the device part is `device_planner`'s plan for the device view; its plan
/// for the whole trace where no op can be placed or the profile runs no host ops. Named as the
/// device planner.
std::unique_ptr<planner> make_all_on_host_planner(std::unique_ptr<planner> device_planner);

/// `on_host` (one entry per op) less the ops the timeline of `sim` (recorded) shows on the host
/// after the device's last op has ended: the steps that hold the end of the iteration up. Only
/// where they end the iteration more than `least_tail_seconds` after the device; else `on_host`.
std::vector<char> tail_on_device(const trace& t, const std::vector<char>& on_host, const sim_result& sim,
                                 double least_tail_seconds = 0);

/// `on_host` less its last host ops in program order (the steps of the weights whose gradients
/// are done last: the first layers'), as many as it takes for the tensors they write that device
/// ops read (the weights they send back up) to add up to `weight_bytes`; then placeable.
std::vector<char> last_steps_on_device(const trace& t, const lifetime_report& r, const std::vector<char>& on_host,
                                       double weight_bytes);

/// auto's host placements: plans with every placeable host op on the host, with those but the
/// ones whose run on the host outlasts the device's work by over 1% of the step (the last
/// gradients' steps: tail_on_device), and with those that are cheaper there, each planned by
/// `plan_view` on the device view and judged by the simulator on `t`, with its result; nothing
/// when no op can go to the host. Where the fastest of them stalls over 1% of its step, up to
/// three more keep the last steps on the device (last_steps_on_device), the weight bytes the
/// link moves in the time it stalls more each round, while each is faster than the one before.
/// `plan_view` gets the view and a judge that simulates a plan for the view as the plan for `t`
/// it becomes (plan_from_view), so its search can weigh the copies the view does not show (the
/// weights up, the gradients down) beside its own.
struct host_candidate {
  plan p;
  sim_result sim;
};
using view_planner = std::function<plan(const device_view&, const std::function<sim_result(const plan&)>&)>;
std::vector<host_candidate> host_candidates(const trace& t, const lifetime_report& r, const hw_profile& hw,
                                            std::uint64_t budget, const std::string& name, const view_planner& plan_view);

}  // namespace spillway::offload::detail
