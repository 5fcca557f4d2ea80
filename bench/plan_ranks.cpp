// spillway-bench plan --ranks N: one rank's trace with ZeRO's collectives (offload/data_parallel)
// planned by each policy and simulated on the profile's network, against the same plan on an
// unlimited network and against the one-rank run; prints the prediction and issue 19's target.
#include "bench/plan_ranks.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "bench/outputs.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/data_parallel.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "offload/rank_planning.hpp"
#include "offload/simulator.hpp"

namespace spillway::bench {

using namespace spillway::offload;

double parse_network_rate(const std::string& text, const std::string& where) {
  if (text == "unlimited") return std::numeric_limits<double>::infinity();
  const struct {
    const char* unit;
    double bytes;
  } units[] = {{"Gb/s", 1e9 / 8}, {"GB/s", 1e9}, {"Mb/s", 1e6 / 8}, {"MB/s", 1e6}};
  for (const auto& u : units) {
    const std::string unit = u.unit;
    if (text.size() <= unit.size() || text.compare(text.size() - unit.size(), unit.size(), unit) != 0) continue;
    const std::string num = text.substr(0, text.size() - unit.size());
    char* end = nullptr;
    const double v = std::strtod(num.c_str(), &end);
    if (end == num.c_str() + num.size() && v > 0 && std::isfinite(v)) return v * u.bytes;
  }
  throw config_error(where + ": cannot use \"" + text + "\": give a rate such as 400Gb/s or 50GB/s, or 'unlimited'");
}

namespace {

struct rank_row {
  std::string policy;
  bool feasible = false, free_feasible = false, one_feasible = false;
  sim_result sim;         // N ranks on the network
  double share = 1;       // the link share its plan was made for
  double early = 0;       // the share of the optimizer step run in the backward pass
  double free_step = 0;   // N ranks on an unlimited network, planned for it
  double same_free = 0;   // the network plan on an unlimited network
  double one_step = 0;    // one rank, its own plan
  double plan_ms = 0;
};

double ms(double s) { return s * 1e3; }
double gib(std::uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

// The rank's share of a node: host CPU, host memory, its bandwidth and NVMe split `k` ways.
hw_profile per_rank(hw_profile hw, std::uint32_t k) {
  if (k <= 1) return hw;
  hw.host_bytes /= k;
  hw.host_mem_bytes_per_s /= k;
  hw.host_cores = std::max(1, hw.host_cores / static_cast<int>(k));
  hw.nvme_read_bytes_per_s /= k;
  hw.nvme_write_bytes_per_s /= k;
  hw.nvme_bytes /= k;
  return hw;
}

std::string rate_text(double bytes_per_s) {
  if (!std::isfinite(bytes_per_s)) return "unlimited";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g Gb/s (%g GB/s)", bytes_per_s * 8 / 1e9, bytes_per_s / 1e9);
  return buf;
}

// The fastest rank plan's timeline (Perfetto / chrome://tracing): one track per stream.
void write_timeline(const std::string& path, const data_parallel_plan& d, const hw_profile& hw) {
  sim_options so;
  so.comm = &d.rank.comm;
  so.record_timeline = true;
  const auto sim = simulate(d.rank.t, d.report, d.best.p, hw, so);
  nlohmann::json events = nlohmann::json::array();
  for (int k = 0; k < sim_track_count; ++k)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", k},
                      {"args", {{"name", std::string(to_string(static_cast<sim_track>(k)))}}}});
  for (const auto& e : sim.timeline) {
    const bool op = e.track == sim_track::compute || e.track == sim_track::recompute || e.track == sim_track::host ||
                    e.track == sim_track::network;
    events.push_back({{"name", op ? d.rank.t.ops[e.id].name : d.rank.t.tensors[e.id].name},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", static_cast<int>(e.track)},
                      {"ts", e.start * 1e6},
                      {"dur", (e.end - e.start) * 1e6},
                      {"args", {{"bytes", e.bytes}}}});
  }
  for (const auto& m : sim.memory)
    events.push_back({{"name", "device memory"}, {"ph", "C"}, {"pid", 0}, {"ts", m.at_us}, {"args", {{"allocated", m.bytes}}}});
  write_output(path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n", "--chrome-trace");
}

}  // namespace

int run_ranks(const ranks_args& a, const trace& t) {
  if (a.ranks == 0) throw config_error("--ranks: give at least 1");
  if (a.zero != 1 && a.zero != 2) throw config_error("--zero: " + std::to_string(a.zero) + " is not a ZeRO stage (1 or 2)");
  if (a.ranks_per_node == 0) throw config_error("--ranks-per-node: give at least 1");
  if (a.ranks_per_node > a.ranks)
    throw config_error("--ranks-per-node: " + std::to_string(a.ranks_per_node) + " is more than the " + std::to_string(a.ranks) +
                       " ranks of the job (--ranks); give from 1 to " + std::to_string(a.ranks));
  // The shares are checked here, before the first line, not by the planner after the header.
  for (double s : a.link_shares)
    if (!(s > 0 && s <= 1))
      throw config_error("--link-share: cannot use " + format_real(s) + ": give a share of the PCIe link above 0 and at most 1 (such as 0.5)");
  for (double s : a.early_step_shares)
    if (!(s >= 0 && s <= 1))
      throw config_error("--early-step-share: cannot use " + format_real(s) + ": give a share of the parameters from 0 to 1 (such as 0.5)");
  data_parallel_options o;
  o.ranks = a.ranks;
  o.stage = a.zero == 1 ? zero_stage::one : zero_stage::two;
  o.bucket_bytes = parse_size(a.bucket, "--bucket");
  if (a.gather == "before_use") o.gather = gather_placement::before_use;
  else if (a.gather == "after_step") o.gather = gather_placement::after_step;
  else throw config_error("--gather: '" + a.gather + "' is not a placement (before_use, after_step)");
  o.gather_ahead = a.gather_ahead;
  o.early_step_lag = a.early_step_lag;
  const auto policies = a.policies.empty() ? std::vector<std::string>{"auto", "zero-offload", "lms", "checkpoint"} : a.policies;
  const auto hws = a.hw.empty() ? std::vector<std::string>{"h200"} : a.hw;

  // Every profile and its network checked before any work.
  const double network = a.network.empty() ? 0 : parse_network_rate(a.network, "--network");
  std::vector<std::pair<hw_profile, hw_profile>> profiles;  // one rank alone, a rank of the job
  for (const auto& hwname : hws) {
    const hw_profile alone = get_profile(hwname);  // one rank has its host to itself
    hw_profile hw = per_rank(alone, a.ranks_per_node);
    if (!a.network.empty()) hw.network_bytes_per_s = network;
    if (a.network_latency_us >= 0) hw.network_latency_s = a.network_latency_us * 1e-6;
    if (!hw.has_network())
      throw config_error("hardware profile '" + hw.name + "' gives no network between ranks: pass --network (e.g. 400Gb/s)");
    profiles.emplace_back(alone, hw);
  }

  const auto rep1 = analyze(t);
  const auto rt = make_rank_trace(t, o);
  const auto one_rank = make_rank_trace(t, {.ranks = 1});
  const auto early_shares = a.early_step_shares.empty() ? std::vector<double>{0, 0.25, 0.5, 0.75, 1} : a.early_step_shares;
  const auto repn = analyze(rt.t);
  std::vector<std::pair<std::string, std::uint64_t>> budgets;
  for (const auto& s : a.budgets) budgets.push_back({s, parse_size(s, "--budget")});
  auto ratios = a.ratios;
  if (budgets.empty() && ratios.empty()) ratios = {0.25};
  for (double r : ratios) {
    if (!(r > 0) || !(r <= 64))
      throw config_error("--budget-ratio: cannot use " + format_real(r) + ": give a fraction such as 0.25, above 0 and at most 64");
    char label[48];
    std::snprintf(label, sizeof label, "%g x one-rank peak", r);
    budgets.push_back({label, static_cast<std::uint64_t>(static_cast<double>(rep1.peak_live_bytes) * r)});
  }

  std::printf("data parallel: %s on %u ranks, ZeRO stage %d, buckets of %s, parameters gathered %s%s\n", a.name.c_str(), a.ranks,
              a.zero, format_bytes(o.bucket_bytes).c_str(), to_string(o.gather).data(),
              o.gather == gather_placement::before_use ? (" (" + std::to_string(o.gather_ahead) + " buckets ahead)").c_str() : "");
  if (a.tokens)
    std::printf("per-rank batch fixed (weak scaling): %llu tokens per rank, %llu per step on %u ranks; efficiency = 1-rank step / "
                "%u-rank step\n",
                static_cast<unsigned long long>(a.tokens), static_cast<unsigned long long>(a.tokens) * a.ranks, a.ranks, a.ranks);
  else
    std::printf("per-rank batch fixed (weak scaling): each rank runs the trace's batch; efficiency = 1-rank step / %u-rank step\n",
                a.ranks);
  std::printf("one rank: peak live %s; a rank of %u: peak live %s, %zu collectives moving %s each way per rank\n",
              format_bytes(rep1.peak_live_bytes).c_str(), a.ranks, format_bytes(repn.peak_live_bytes).c_str(),
              rt.comm.collectives.size(), format_bytes(rt.comm.wire_bytes()).c_str());

  bool all_ok = true;
  for (const auto& [alone, hw] : profiles) {
    hw_profile free_hw = hw;  // the reference: an unlimited network, no latency
    free_hw.network_bytes_per_s = std::numeric_limits<double>::infinity();
    free_hw.network_latency_s = 0;
    std::printf("\n%s, network %s, %.1f us per ring step, %s\n", hw.name.c_str(), rate_text(hw.network_bytes_per_s).c_str(),
                hw.network_latency_s * 1e6,
                a.ranks_per_node > 1 ? ("one host (CPU, memory, NVMe) shared by " + std::to_string(a.ranks_per_node) + " ranks").c_str()
                                     : "each rank with the profile's host to itself (--ranks-per-node to share one)");
    for (const auto& [label, budget] : budgets) {
      std::printf("budget %s per rank (%s)\n", format_bytes(budget).c_str(), label.c_str());
      std::printf("  %-13s %10s %5s %5s %11s %7s %10s %6s %8s %8s %8s %8s %9s %8s %s\n", "policy", "step_ms", "link", "early", "free_net_ms",
                  "/same", "1rank_ms", "eff", "net_ms", "net_GiB", "h2d_GiB", "d2h_GiB", "peak_GiB", "plan_ms", "ok");
      std::vector<rank_row> rows;
      std::optional<data_parallel_plan> fastest;  // for --chrome-trace
      for (const auto& pol : policies) {
        rank_row row;
        row.policy = pol;
        rank_plan_options po;
        po.policies = {pol};
        if (!a.link_shares.empty()) po.link_shares = a.link_shares;
        if (budget >= rep1.min_budget_bytes) {
          const auto one = plan_rank(one_rank, rep1, alone, budget, po);
          row.one_feasible = one.found;
          row.one_step = one.sim.step_seconds;
        }
        if (budget >= repn.min_budget_bytes) {
          const auto t0 = std::chrono::steady_clock::now();
          const auto net = plan_data_parallel(t, o, early_shares, hw, budget, po);
          row.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          row.feasible = net.best.found;
          if (net.best.found && (!fastest || net.best.sim.step_seconds < fastest->best.sim.step_seconds)) fastest = net;
          row.sim = net.best.sim;
          row.share = net.best.link_share;
          row.early = net.early_step_share;
          sim_options so;
          so.comm = &net.rank.comm;
          row.same_free = net.best.found ? simulate(net.rank.t, net.report, net.best.p, free_hw, so).step_seconds : 0;
          const auto free = plan_data_parallel(t, o, early_shares, free_hw, budget, po);
          row.free_feasible = free.best.found;
          row.free_step = free.best.sim.step_seconds;
        }
        if (budget < repn.min_budget_bytes) {
          std::printf("  %-13s budget below the least any plan of a rank needs (%s)\n", pol.c_str(),
                      format_bytes(repn.min_budget_bytes).c_str());
        } else if (!row.feasible || !row.free_feasible) {
          std::printf("  %-13s no feasible plan%s\n", pol.c_str(), row.feasible ? " on an unlimited network" : "");
        } else {
          std::printf("  %-13s %10.2f %5.2f %5.2f %11.2f %7.3f %10.2f %6.3f %8.2f %8.2f %8.2f %8.2f %9.2f %8.1f %s\n", pol.c_str(),
                      ms(row.sim.step_seconds), row.share, row.early, ms(row.free_step), row.sim.step_seconds / row.same_free,
                      row.one_feasible ? ms(row.one_step) : NAN, row.one_feasible ? row.one_step / row.sim.step_seconds : NAN,
                      ms(row.sim.network_seconds), gib(row.sim.network_bytes), gib(row.sim.h2d_bytes), gib(row.sim.d2h_bytes),
                      gib(row.sim.peak_device_bytes), row.plan_ms, row.feasible ? "yes" : "NO");
        }
        rows.push_back(std::move(row));
      }
      // The prediction: the fastest feasible plan of each run (each planned for its own case).
      const rank_row *best = nullptr, *best_free = nullptr, *best_one = nullptr;
      for (const auto& r : rows) {
        if (r.feasible && (!best || r.sim.step_seconds < best->sim.step_seconds)) best = &r;
        if (r.free_feasible && (!best_free || r.free_step < best_free->free_step)) best_free = &r;
        if (r.one_feasible && (!best_one || r.one_step < best_one->one_step)) best_one = &r;
      }
      if (!best || !best_free || !best_one) {
        std::printf("  no feasible plan for %s\n", !best ? "the ranks" : !best_one ? "one rank" : "the unlimited network");
        all_ok = false;
        continue;
      }
      if (!a.chrome_file.empty() && fastest) write_timeline(a.chrome_file, *fastest, hw);
      const double ratio = best->sim.step_seconds / best_free->free_step;
      const double eff = best_one->one_step / best->sim.step_seconds;
      std::printf("  predicted: %u-rank step %.2f ms (%s), %.2f ms on an unlimited network (%s), 1-rank step %.2f ms (%s)\n",
                  a.ranks, ms(best->sim.step_seconds), best->policy.c_str(), ms(best_free->free_step), best_free->policy.c_str(),
                  ms(best_one->one_step), best_one->policy.c_str());
      std::printf("  scaling efficiency %.3f: %u ranks do %.2fx the work of one per second%s\n", eff, a.ranks, eff * a.ranks,
                  eff > 1 ? " (above 1: each rank holds 1/N of the optimizer state, so at the same budget it swaps or recomputes less)"
                          : "");
      if (a.model_flops > 0)
        std::printf("  model TFLOP/s per rank: %.1f on %u ranks, %.1f alone\n", a.model_flops / best->sim.step_seconds / 1e12, a.ranks,
                    a.model_flops / best_one->one_step / 1e12);
      char line[512];
      std::snprintf(line, sizeof line,
                    "target: %s on %u ranks of %s at budget %s per rank, %s network: step / unlimited-network step = "
                    "%.3f / %.3f ms = %.4f (target <= 1.1) : %s",
                    a.name.c_str(), a.ranks, hw.name.c_str(), label.c_str(), rate_text(hw.network_bytes_per_s).c_str(),
                    ms(best->sim.step_seconds), ms(best_free->free_step), ratio, ratio <= 1.1 ? "PASS" : "MISS");
      std::printf("%s\n", line);
      all_ok = all_ok && ratio <= 1.1;
    }
  }
  return all_ok ? 0 : 1;
}

}  // namespace spillway::bench
