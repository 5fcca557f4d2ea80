// Planning one data-parallel rank with the network in view: every policy's plan for the link the
// offload copies have left beside the collectives, judged by the simulator's network stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "offload/data_parallel.hpp"
#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "offload/simulator.hpp"
#include "prefetch/plan.hpp"

namespace spillway::offload {

/// Note [Planning with the network]
/// The planners know nothing of collectives: to them a collective is an op of no time, and they
/// plan their copies as if the PCIe link were theirs alone. On a rank the network's traffic
/// crosses that link too (Note [Network stream] in simulator.hpp), so a plan that fills the link
/// with swaps leaves the collectives queued behind them and the step waits. plan_rank asks each
/// policy for a plan against the link as it is and against the link scaled down to each share
/// in link_shares (the planner then swaps less and recomputes or keeps more), simulates every
/// plan with the collectives on the network, and keeps the fastest feasible one (the first
/// found on a tie: policies in order, shares in order). With a one-rank trace and the share 1
/// alone it is the policy's own plan.
struct rank_plan_options {
  std::vector<std::string> policies = {"auto"};
  std::vector<double> link_shares = {1.0, 0.5, 0.35, 0.25, 0.15};
};

struct rank_plan {
  plan p;
  std::string policy;
  double link_share = 1;
  sim_result sim;          ///< the plan on the profile's network
  std::size_t tried = 0;   ///< plans simulated
  bool found = false;      ///< some plan was feasible
};

/// `rep` must be analyze(r.t). Throws config_error when budget is below the least any plan
/// needs (as the planners do), or a policy is unknown.
rank_plan plan_rank(const rank_trace& r, const lifetime_report& rep, const hw_profile& hw, std::uint64_t budget,
                    const rank_plan_options& o = {});

}  // namespace spillway::offload
