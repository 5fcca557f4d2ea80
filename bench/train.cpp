// spillway-bench train: trains an example (gpt, mlp, cnn) with everything resident and under
// each policy and budget ratio, and compares step time, bytes moved, stalls and losses. The runs
// are interleaved step by step (Note [Interleaved runs]).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "examples/common/flags.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/report.hpp"
#include "examples/gpt/gpt_model.hpp"
#include "examples/mlp/mlp_model.hpp"
#include "offload/trace_json.hpp"

namespace spillway::bench {
namespace {

using examples::example_options;
using examples::run_result;

struct train_args {
  std::string example = "gpt";
  std::vector<double> ratios = {0.5, 0.25};
  std::vector<std::string> policies = {"none", "lms", "vdnn", "auto"};
  int steps = 6;
  examples::config_flags config;  // --config and the session settings' flags but --policy, --device-budget
  std::string preset = "small";
  std::uint64_t seed = 1;
  std::string json;
  std::string save_runs;  ///< a directory: each run's recorded trace and Chrome timeline
};

// --steps: at most 100,000 a run, far past the handful a comparison needs (the default is 6).
constexpr std::uint64_t max_train_steps = 100000;

// Target: on the cpu backend, auto at 1/4 of the footprint within 1.15x of everything resident.
constexpr double target_ratio = 0.25;
constexpr double target_slowdown = 1.15;
// Target: gpt at 1/8 of the footprint with recomputation (the best of checkpoint, capuchin and
// auto among the settings run) within 1.25x of everything resident.
constexpr double recompute_ratio = 0.125;
constexpr double recompute_slowdown = 1.25;
// Target: gpt and mlp at 1/8 of the footprint with the optimizer on the host (a policy written
// POLICY@host: host_ops = host) within 1.25x of everything resident, losses identical.
constexpr double host_ratio = 0.125;
constexpr double host_slowdown = 1.25;

/// "auto@host" -> ("auto", "host"); "lms" -> ("lms", "") (the config's host_ops).
std::pair<std::string, std::string> split_policy(const std::string& p) {
  const auto at = p.find('@');
  if (at == std::string::npos) return {p, ""};
  return {p.substr(0, at), p.substr(at + 1)};
}

struct row {
  std::string policy;
  double budget_ratio = 0;
  run_result result;
  double ratio = 0;
  bool losses_match = false;
  bool skipped = false;  ///< budget below the least any plan needs
};

bool same_losses(const run_result& a, const run_result& b) {
  if (a.losses.size() != b.losses.size()) return false;
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    if (examples::format_loss(a.losses[i]) != examples::format_loss(b.losses[i])) return false;
  return true;
}

// Note [Interleaved runs]
// This bench runs on shared, noisy machines, where the load can change between one run and the
// next. All runs stay open at once and take turns a step at a time: the everything-resident
// step, then each setting's step of the same index. A setting's ratio is the median, over its
// planned steps, of its step time over the resident step taken just before it, so a change of
// load moves both sides of each ratio alike.

// With --save-runs DIR, each run leaves DIR/EXAMPLE-SETTING.trace.json (the trace its plan was
// made from, with the op times measured on this machine: `spillway-bench plan --trace` plans it
// again) and DIR/EXAMPLE-SETTING.chrome.json (its real iterations, for Perfetto).
std::string run_file(const train_args& a, const std::string& setting, const char* what) {
  std::string name = a.example + "-" + setting;
  for (char& c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_')) c = '_';
  return a.save_runs + "/" + name + "." + what + ".json";
}

void save_trace(const train_args& a, const std::string& setting, Session& s) {
  if (a.save_runs.empty()) return;
  write_output(run_file(a, setting, "trace"), offload::trace_to_json(s.recorded_trace()).dump() + "\n", "--save-runs");
}

examples::model_factory factory_for(const std::string& example, const example_options& o) {
  if (example == "gpt") return [o] { return examples::make_gpt(o); };
  if (example == "mlp") return [o] { return examples::make_mlp(o); };
  return [o] { return examples::make_cnn(o); };
}

/// A ratio to pick the fastest by: a row without one (NaN) last.
double by_ratio(double r) { return std::isfinite(r) ? r : std::numeric_limits<double>::infinity(); }

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt(const char* f, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

// The median over the run's planned steps (the recording step moves and waits on demand by
// design) of one figure of a step's report; over every step when none was planned.
double per_step(const run_result& r, auto figure) {
  std::vector<double> v;
  for (const auto& it : r.iterations)
    if (it.planned) v.push_back(static_cast<double>(figure(it)));
  if (v.empty())
    for (const auto& it : r.iterations) v.push_back(static_cast<double>(figure(it)));
  return median_of(std::move(v));
}
double h2d_per_step(const run_result& r) { return per_step(r, [](const iteration_report& i) { return i.h2d_bytes; }); }
double d2h_per_step(const run_result& r) { return per_step(r, [](const iteration_report& i) { return i.d2h_bytes; }); }
double nvme_per_step(const run_result& r) {
  return per_step(r, [](const iteration_report& i) { return i.nvme_read_bytes + i.nvme_write_bytes; });
}
double planned_per_step(const run_result& r) {
  return per_step(r, [](const iteration_report& i) { return i.planned_step_ms; });
}
double stall_per_step(const run_result& r) { return per_step(r, [](const iteration_report& i) { return i.stall_ms; }); }
double reruns_per_step(const run_result& r) { return per_step(r, [](const iteration_report& i) { return i.recomputes; }); }

std::string table_line(const std::string& policy, const std::string& budget, const run_result& r, double ratio,
                       const std::string& match) {
  auto bytes = [](double b) { return format_bytes(static_cast<std::uint64_t>(b)); };
  // No planned step (every step recorded): no plan to time and no ratio, shown as '-', not 0 and nan.
  const bool timed = std::isfinite(ratio);
  const std::string planned = timed ? fmt("%.1f", planned_per_step(r)) : "-";
  const std::string ratio_text = timed ? fmt("%.3f", ratio) : "-";
  return fmt("%-15s %-16s %9.1f %9s %7s %11s %11s %11s %11s %9.1f %7.0f %6s", policy.c_str(), budget.c_str(), r.median_step_ms(),
             planned.c_str(), ratio_text.c_str(), bytes(h2d_per_step(r)).c_str(), bytes(d2h_per_step(r)).c_str(), bytes(nvme_per_step(r)).c_str(),
             format_bytes(r.peak_device_bytes).c_str(), stall_per_step(r), reruns_per_step(r), match.c_str());
}

nlohmann::json row_json(const std::string& example, const row& w, const run_result& resident) {
  const run_result& r = w.result;
  if (w.skipped)
    return {{"example", example}, {"policy", w.policy}, {"budget_ratio", w.budget_ratio}, {"skipped", true},
            {"reason", "budget below the least any plan needs"}, {"resident_step_ms", resident.median_step_ms()}};
  return {{"example", example},
          {"policy", w.policy},
          {"budget_ratio", w.budget_ratio},
          {"budget_bytes", r.device_budget_bytes},
          {"step_ms", r.median_step_ms()},
          {"resident_step_ms", resident.median_step_ms()},
          {"ratio", w.ratio},
          {"planned_step_ms", planned_per_step(r)},
          {"losses_match", w.losses_match},
          {"h2d_bytes", r.h2d_bytes},
          {"d2h_bytes", r.d2h_bytes},
          {"nvme_read_bytes", r.nvme_read_bytes},
          {"nvme_write_bytes", r.nvme_write_bytes},
          {"peak_device_bytes", r.peak_device_bytes},
          {"stall_ms", r.stall_ms},
          {"h2d_bytes_per_step", h2d_per_step(r)},
          {"d2h_bytes_per_step", d2h_per_step(r)},
          {"stall_ms_per_step", stall_per_step(r)},
          {"on_demand_fetches", r.on_demand_fetches},
          {"on_demand_evictions", r.on_demand_evictions},
          {"prefetches_deferred", r.prefetches_deferred},
          {"fragmented_allocations", r.fragmented_allocations},
          {"layout_misses", per_step(r, [](const iteration_report& i) { return i.layout_misses; })},
          {"host_op_ms_per_step", per_step(r, [](const iteration_report& i) { return i.host_op_ms; })},
          {"host_op_wait_ms_per_step", per_step(r, [](const iteration_report& i) { return i.host_op_wait_ms; })},
          {"recomputes", r.recomputes},
          {"recomputes_per_step", reruns_per_step(r)},
          {"host_ops", r.host_ops},
          {"step_ms_all", r.step_ms()},
          {"skipped", false}};
}

int run(const train_args& a) {
  if (a.example != "gpt" && a.example != "mlp" && a.example != "cnn")
    throw config_error("--example: '" + a.example + "' is not an example (gpt, mlp, cnn)");
  for (double r : a.ratios)
    if (!(r > 0)) throw config_error("--budget-ratio: " + format_real(r) + " is not a ratio above 0 (such as 0.25)");
  if (!a.save_runs.empty()) check_writable(run_file(a, "resident", "trace"), "--save-runs");
  check_outputs({{"--json", a.json}}, {{"--config", a.config.config_file}});
  example_options base;
  session_config defaults;  // this benchmark's: the cpu backend behind a PCIe 3.0 x16-like link
  defaults.backend = "cpu";
  defaults.link_gbps = 12;
  static_cast<session_config&>(base) = examples::load_config(a.config, defaults);
  if (base.backend != "cpu" && base.source_of("link_gbps") == "link_gbps") base.link_gbps = 0;  // measured on a GPU
  base.steps = a.steps;
  base.seed = a.seed;
  base.size = examples::parse_preset(a.preset);
  base.policy = "none";
  base.validate();
  for (const auto& p : a.policies) {
    example_options o = base;
    const auto [policy, host_ops] = split_policy(p);
    o.policy = policy;
    if (!host_ops.empty()) o.host_ops = host_ops;
    o.validate();  // a bad policy or placement fails here, before any training
  }
  if (a.steps < 2) throw config_error("--steps: " + std::to_string(a.steps) + " leaves no step after the recording one");

  const auto make = factory_for(a.example, base);
  // On a GPU the runs share one device: the everything-resident run keeps its footprint and a
  // tenth more (set after its recording step, which runs at the whole free memory), not all the
  // free memory, so the others, opened after that step, fit beside it.
  example_options resident_options = base;
  if (base.backend != "cpu") resident_options.budget_ratio = 1.1;
  if (!a.save_runs.empty()) resident_options.chrome_trace = run_file(a, "resident", "chrome");
  examples::training_run resident_run(resident_options, make);
  resident_run.step();  // the first step learns the footprint the budgets are fractions of
  const std::uint64_t footprint = resident_run.result().footprint_bytes;
  const std::uint64_t least = resident_run.result().min_budget_bytes;

  struct setting {
    row w;
    std::unique_ptr<examples::training_run> run;
    std::vector<double> ratios;  // per planned step: its time over the resident step before it
    std::string name;            // POLICY-RATIO, for --save-runs' files
  };
  std::vector<setting> settings;
  for (double ratio : a.ratios) {
    for (const auto& policy : a.policies) {
      setting st;
      st.w.policy = policy;
      st.w.budget_ratio = ratio;
      example_options o = base;
      const auto [name, host_ops] = split_policy(policy);
      o.policy = name;
      if (!host_ops.empty()) o.host_ops = host_ops;
      o.device_budget = static_cast<std::uint64_t>(std::llround(ratio * static_cast<double>(footprint)));
      st.name = policy + "-" + fmt("%g", ratio);
      if (!a.save_runs.empty()) o.chrome_trace = run_file(a, st.name, "chrome");
      if (o.device_budget < least) {
        st.w.skipped = true;
      } else {
        st.run = std::make_unique<examples::training_run>(o, make);
        st.run->step();  // its recording step
      }
      settings.push_back(std::move(st));
    }
  }
  for (int step = 1; step < a.steps; ++step) {
    resident_run.step();
    const double base_ms = resident_run.result().iterations.back().step_ms;
    for (auto& st : settings) {
      if (!st.run) continue;
      st.run->step();
      const auto& it = st.run->result().iterations.back();
      if (it.planned && base_ms > 0) st.ratios.push_back(it.step_ms / base_ms);
    }
  }
  save_trace(a, "resident", resident_run.session());
  const run_result resident = resident_run.finish();

  const bool cpu = resident.backend == "cpu";
  std::cout << "train " << a.example << ": " << resident.model << "\n"
            << "backend " << resident.backend;
  if (cpu)
    std::cout << ", link " << (base.link_gbps > 0 ? fmt("%.3g GB/s each way (PCIe-like)", base.link_gbps) : std::string("unlimited"));
  std::cout << ", " << a.steps << " steps (median without the recording step), footprint "
            << format_bytes(footprint) << ", least budget " << format_bytes(least) << "\n"
            << "runs interleaved step by step; ratio = median over planned steps of step time / the resident "
               "step just before it; plan ms: the simulator's step for the plan followed, on the measured "
               "hardware; h2d, d2h, nvme, stall and reruns (of recomputable ops): median per planned step\n\n";
  std::cout << fmt("%-15s %-16s %9s %9s %7s %11s %11s %11s %11s %9s %7s %6s", "policy", "budget", "step ms", "plan ms", "ratio", "h2d",
                   "d2h", "nvme", "peak dev", "stall ms", "reruns", "losses")
            << "\n";
  std::cout << table_line("resident", "all", resident, 1.0, "ref") << std::endl;

  std::vector<row> rows;
  for (auto& st : settings) {
    row w = std::move(st.w);
    const std::uint64_t budget = static_cast<std::uint64_t>(std::llround(w.budget_ratio * static_cast<double>(footprint)));
    if (w.skipped) {
      std::cout << fmt("%-15s %-16s skipped: below the least budget any plan needs (%s)", w.policy.c_str(),
                       fmt("%.3g (%s)", w.budget_ratio, format_bytes(budget).c_str()).c_str(), format_bytes(least).c_str())
                << std::endl;
      rows.push_back(std::move(w));
      continue;
    }
    save_trace(a, st.name, st.run->session());
    w.result = st.run->finish();
    st.run.reset();
    // No planned step (the run recorded again every step, e.g. --steps 2 with a plan that moved
    // its updates after the pass): no ratio, and no target met by it.
    w.ratio = st.ratios.empty() ? std::numeric_limits<double>::quiet_NaN() : median_of(st.ratios);
    w.losses_match = same_losses(w.result, resident);
    std::cout << table_line(w.policy, fmt("%.3g (%s)", w.budget_ratio, format_bytes(budget).c_str()), w.result, w.ratio,
                            w.losses_match ? "same" : "DIFF")
              << std::endl;
    rows.push_back(std::move(w));
  }

  if (std::any_of(rows.begin(), rows.end(), [](const row& w) { return !w.skipped && !std::isfinite(w.ratio); }))
    std::cout << "-: no planned step to time (every step of that run recorded; a plan that moves the updates after the "
                 "pass records twice): give more --steps\n";
  int exit_code = 0;
  for (const auto& w : rows)
    if (!w.skipped && !w.losses_match) exit_code = 1;
  nlohmann::json target = {{"description", "cpu backend: auto at budget 1/4 of the footprint within 1.15x of "
                                           "everything resident, identical losses"}};
  const row* t = nullptr;
  for (const auto& w : rows)
    if (w.policy == "auto" && std::abs(w.budget_ratio - target_ratio) < 1e-9 && !w.skipped) t = &w;
  std::cout << "\n";
  if (!cpu || t == nullptr) {
    std::cout << "target (cpu backend, auto at budget 0.25): not measured by these settings\n";
    target["result"] = "not measured";
  } else {
    const bool pass = std::isfinite(t->ratio) && t->ratio <= target_slowdown && t->losses_match;
    if (!std::isfinite(t->ratio))
      std::cout << "target: auto at budget 1/4 had no planned step to time (every step recorded; give more --steps): MISS\n";
    else
      std::cout << fmt("target: auto at budget 1/4 runs at %.3fx of everything resident (<= %.2fx), losses %s: %s\n",
                       t->ratio, target_slowdown, t->losses_match ? "identical" : "DIFFER", pass ? "PASS" : "MISS");
    target["result"] = pass ? "PASS" : "MISS";
    target["ratio"] = t->ratio;
    if (!pass) exit_code = 1;
  }

  // The recomputation target: the fastest setting at 1/8 of the footprint whose plan reran ops
  // (a policy that chose to swap only does not count), the optimizer wherever its setting put it.
  nlohmann::json recompute_target = {{"description", "gpt: checkpoint, capuchin or auto at budget 1/8 of the footprint "
                                                     "within 1.25x of everything resident, identical losses"}};
  const row* rt = nullptr;
  for (const auto& w : rows) {
    const std::string base = split_policy(w.policy).first;  // with any optimizer placement
    const bool recomputing = base == "checkpoint" || base == "capuchin" || base == "auto";
    if (recomputing && std::abs(w.budget_ratio - recompute_ratio) < 1e-9 && !w.skipped && w.result.recomputes > 0 &&
        (rt == nullptr || by_ratio(w.ratio) < by_ratio(rt->ratio)))
      rt = &w;
  }
  if (a.example != "gpt" || rt == nullptr) {
    std::cout << "target (gpt, checkpoint/capuchin/auto at budget 0.125, with reruns): not measured by these settings\n";
    recompute_target["result"] = "not measured";
  } else {
    const bool pass = std::isfinite(rt->ratio) && rt->ratio <= recompute_slowdown && rt->losses_match;
    const double planned_steps = std::max(1, a.steps - 1);
    std::cout << fmt("target: gpt at budget 1/8 with recomputation (%s, %.0f reruns a step) runs at %.3fx of everything "
                     "resident (<= %.2fx), losses %s: %s\n",
                     rt->policy.c_str(), static_cast<double>(rt->result.recomputes) / planned_steps, rt->ratio,
                     recompute_slowdown, rt->losses_match ? "identical" : "DIFFER", pass ? "PASS" : "MISS");
    recompute_target["result"] = pass ? "PASS" : "MISS";
    recompute_target["policy"] = rt->policy;
    recompute_target["ratio"] = rt->ratio;
    if (!pass) exit_code = 1;
  }

  // The host-placement target: the fastest setting at 1/8 of the footprint that ran the
  // optimizer on the host (POLICY@host, with host ops in its plan).
  nlohmann::json host_target = {{"description", "gpt and mlp: the optimizer on the host (POLICY@host) at budget 1/8 of "
                                                "the footprint within 1.25x of everything resident, identical losses"}};
  const row* ht = nullptr;
  for (const auto& w : rows) {
    const bool on_host = split_policy(w.policy).second == "host";
    if (on_host && std::abs(w.budget_ratio - host_ratio) < 1e-9 && !w.skipped && w.result.host_ops > 0 &&
        (ht == nullptr || by_ratio(w.ratio) < by_ratio(ht->ratio)))
      ht = &w;
  }
  if ((a.example != "gpt" && a.example != "mlp") || !cpu || ht == nullptr) {
    std::cout << "target (gpt or mlp, POLICY@host at budget 0.125): not measured by these settings\n";
    host_target["result"] = "not measured";
  } else {
    const bool pass = std::isfinite(ht->ratio) && ht->ratio <= host_slowdown && ht->losses_match;
    const double planned_steps = std::max(1, a.steps - 1);
    std::cout << fmt("target: %s at budget 1/8 with the optimizer on the host (%s, %.0f host ops a step) runs at %.3fx "
                     "of everything resident (<= %.2fx), losses %s: %s\n",
                     a.example.c_str(), ht->policy.c_str(), static_cast<double>(ht->result.host_ops) / planned_steps,
                     ht->ratio, host_slowdown, ht->losses_match ? "identical" : "DIFFER", pass ? "PASS" : "MISS");
    host_target["result"] = pass ? "PASS" : "MISS";
    host_target["policy"] = ht->policy;
    host_target["ratio"] = ht->ratio;
    if (!pass) exit_code = 1;
  }

  if (!a.json.empty()) {
    nlohmann::json j = {{"example", a.example},
                        {"model", resident.model},
                        {"backend", resident.backend},
                        {"preset", a.preset},
                        {"steps", a.steps},
                        {"link_gbps", cpu ? nlohmann::json(base.link_gbps) : nlohmann::json(nullptr)},
                        {"footprint_bytes", resident.footprint_bytes},
                        {"min_budget_bytes", resident.min_budget_bytes},
                        {"resident_step_ms", resident.median_step_ms()},
                        {"target", target},
                        {"recompute_target", recompute_target},
                        {"host_target", host_target}};
    nlohmann::json rj = nlohmann::json::array();
    for (const auto& w : rows) rj.push_back(row_json(a.example, w, resident));
    j["rows"] = rj;
    write_output(a.json, j.dump(2) + "\n", "--json");
  }
  return exit_code;
}

const command_registration registration{"train", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<train_args>();
  auto* cmd = app.add_subcommand("train", "train an example under each policy and budget against everything resident");
  cmd->add_option("--example", args->example, "gpt, mlp or cnn")->capture_default_str();
  cmd->add_option("--budget-ratio", args->ratios, "device budget as a fraction of the footprint (repeatable)")
      ->capture_default_str();
  cmd->add_option("--policy", args->policies, "none, lms, vdnn, auto, checkpoint, capuchin or zero-offload, each optionally POLICY@host or POLICY@device "
                  "(the optimizer's placement, setting host_ops) (repeatable)")->capture_default_str();
  cmd->add_option("--steps", args->steps, "training steps per run (the first records)")
      ->capture_default_str()
      ->check(whole_number_in(1, max_train_steps));
  cmd->add_option("--preset", args->preset, "tiny, small, medium or large")->capture_default_str();
  examples::add_config_flags(*cmd, args->config,
                             {"backend", "cpu_device_memory", "cpu_callback_seed", "link_gbps", "host_budget",
                              "nvme.directories", "nvme.reserve", "lms_swapout_threshold", "lms_swapin_ahead",
                              "lms_swapin_groupby", "vdnn_variant"});
  cmd->add_option("--seed", args->seed, "seed of weights and data")->capture_default_str()->check(whole_number);
  cmd->add_option("--json", args->json, "write the rows as JSON")->check(writable_file);
  cmd->add_option("--save-runs", args->save_runs,
                  "a directory for each run's recorded trace (EXAMPLE-SETTING.trace.json, with the measured op times) "
                  "and Chrome timeline (EXAMPLE-SETTING.chrome.json)")
      ->check(CLI::ExistingDirectory);
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}};

}  // namespace
}  // namespace spillway::bench
