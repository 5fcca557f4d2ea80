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
/// in link_shares (the planner then swaps less and recomputes or keeps more), and simulates
/// every plan with the collectives on the network twice: as made, and with its copies issued
/// soonest use first, collectives counted (a prefetch for a later op than a collective or
/// prefetch issued after it is issued after that one instead; the link is shared in order of
/// issue, so a collective then does not wait behind copies for ops after it). It keeps the
/// fastest feasible plan (the first found on a tie: policies, shares, then the order as made).
/// plan_data_parallel does this for each share of the optimizer step run in the backward pass
/// (Note [Data parallel] in data_parallel.hpp), which moves all-gathers from the forward pass,
/// where they compete with the parameters' first reads, into the backward pass beside the
/// reduce-scatters. With a one-rank trace, the share 1 alone and the plan as made, plan_rank
/// is the policy's own plan.
struct rank_plan_options {
  std::vector<std::string> policies = {"auto"};
  std::vector<double> link_shares = {1.0, 0.5, 0.35, 0.25, 0.15, 0.1};
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

/// A rank's trace and its plan, the fastest over the rank traces tried.
struct data_parallel_plan {
  rank_trace rank;
  lifetime_report report;  ///< analyze(rank.t)
  rank_plan best;
  double early_step_share = 0;
};
/// plan_rank over the rank traces of `t` with `dp` and each of `early_step_shares` in turn
/// (data_parallel_options::early_step_share; Note [Data parallel]): how much of the optimizer
/// step runs in the backward pass, so that its all-gathers share the network with the backward
/// pass's reduce-scatters rather than the next forward pass, is chosen by the same simulation.
/// Ties keep the first share. config_error as make_rank_trace and plan_rank, or with no share.
data_parallel_plan plan_data_parallel(const trace& t, const data_parallel_options& dp, const std::vector<double>& early_step_shares,
                                      const hw_profile& hw, std::uint64_t budget, const rank_plan_options& o = {});

}  // namespace spillway::offload
