// spillway-bench replay: runs a trace for real on the cpu backend through the executor (ops are
// timed busy work, copies held to a link bandwidth) and sets the measured step time beside the
// simulator's prediction for the same trace, plan and link, and the lower bound.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "examples/common/flags.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/fit_plan.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "offload/session_trace.hpp"
#include "offload/simulator.hpp"
#include "offload/trace_json.hpp"
#include "offload/zoo.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"

namespace spillway::bench {
namespace {
using namespace spillway::offload;
using clk = std::chrono::steady_clock;

struct replay_args {
  std::vector<std::string> models;
  std::string trace_file;
  std::string hw = "h200";
  std::uint32_t batch = 0, seq = 0, layers = 0;
  double scale = 0;         // replay seconds per profile second; 0: ideal step of about target_ms
  bool scale_given = false, target_given = false;
  double target_ms = 300;
  double link_gbps = 0;     // 0: set so the least forced transfer takes 40% of the ideal step
  examples::config_flags config;  // --config, --cpu-device-memory (emulated device memory; default 160 MiB)
  std::vector<double> ratios = {0.5, 0.25};
  std::vector<std::string> policies = {"lms", "vdnn", "auto"};
  int iterations = 3;
  std::string json_file;
  std::string chrome_file;
};

struct result_row {
  std::string model, policy;
  double ratio = 0;
  std::uint64_t budget = 0;
  double measured_ms = 0, predicted_ms = 0, lower_bound_ms = 0, ideal_ms = 0, stall_ms = 0;
  std::uint64_t h2d = 0, d2h = 0;
  std::uint64_t on_demand = 0;
  bool feasible = true;
};

/// An op's stand-in: holds the compute stream for the op's duration. It sleeps most of it and
/// spins the end, so the copy engines' threads keep a core on a small machine (stream threads
/// wake close to time: the cpu backend sets a 1 us timer slack on them).
void work_for(double seconds) {
  const auto deadline = clk::now() + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(seconds));
  std::this_thread::sleep_until(deadline - std::chrono::microseconds(60));  // a sleep overshoots by ~60 us
  while (clk::now() < deadline) {
  }
}

/// The trace with bytes divided by `shrink` and every op given its replay duration.
trace scaled(const trace& in, const hw_profile& hw, double shrink, double scale) {
  trace t = in;
  for (auto& d : t.tensors) d.bytes = std::max<std::uint64_t>(64, static_cast<std::uint64_t>(static_cast<double>(d.bytes) / shrink));
  for (auto& op : t.ops) op.measured_seconds = hw.op_seconds(op) * scale;
  return t;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

result_row replay_one(const trace& t, const lifetime_report& rep, const hw_profile& hw, const std::string& policy,
                      double ratio, std::uint64_t memory, int iterations, const std::string& chrome_file) {
  result_row row;
  row.policy = policy;
  row.ratio = ratio;
  row.budget = std::max<std::uint64_t>(static_cast<std::uint64_t>(ratio * static_cast<double>(rep.peak_live_bytes)),
                                       rep.min_budget_bytes + rep.min_budget_bytes / 16);
  const auto planner = make_planner(policy);
  const auto b = compute_bounds(t, rep, hw, row.budget);
  row.lower_bound_ms = b.lower_bound_seconds * 1e3;
  row.ideal_ms = b.ideal_seconds * 1e3;
  // As the Session does (Note [Headroom] in allocator/device_budget.hpp): plan under the budget
  // by the packing margin, lowered until the packed layout of the plan's allocations fits
  // (offload/fit_plan.hpp), and plan again with the margin doubled while the plan does not fit in
  // practice.
  int margin_doublings = device_budget::no_margin;
  plan p;
  device_layout layout;
  sim_result sim;
  auto make = [&] {
    auto fitted = fit_plan(*planner, t, rep, hw, device_budget(row.budget), margin_doublings, {});
    margin_doublings = fitted.margin_doublings;
    const std::uint64_t plan_budget = fitted.p.budget_bytes;
    p = std::move(fitted.p);
    layout = std::move(fitted.layout);
    sim = simulate(t, p, hw);
    row.predicted_ms = sim.step_seconds * 1e3;
    row.feasible = sim.violation_count == 0 && sim.peak_device_bytes <= plan_budget;
  };
  make();

  device_options o;
  o.cpu_device_memory = memory;
  o.h2d_bytes_per_second = hw.h2d_bytes_per_s;
  o.d2h_bytes_per_second = hw.d2h_bytes_per_s;
  cpu_device dev(o);
  executor_stack_options so;
  so.device_budget = row.budget;
  so.timeline = !chrome_file.empty();
  std::vector<double> steps, stalls;
  {
    executor_stack stack(dev, so);
    executor& ex = stack.exec();
    for (tensor_id id = 0; id < t.tensors.size(); ++id) {
      ex.define(id, t.tensors[id]);
      if (is_persistent(t.tensors[id].kind)) ex.upload(id, nullptr);
    }
    std::vector<std::vector<tensor_id>> dies_after(t.ops.size());
    for (tensor_id id = 0; id < t.tensors.size(); ++id) {
      const auto& life = rep.tensors[id];
      if (life.used() && !is_persistent(t.tensors[id].kind)) dies_after[life.last_use()].push_back(id);
    }
    // A rerun the plan asks for (Note [Recomputation] in prefetch/plan.hpp) runs the op's stand-in
    // kernel again, on the compute stream as the op itself.
    ex.set_rerun([&](op_index o) {
      const double seconds = *t.ops[o].measured_seconds;
      dev.launch_kernel(ex.compute_stream(), [seconds] { work_for(seconds); });
    });
    ex.follow(&t, &p, &layout);
    int warmups = 0;
    for (int it = 0; it <= iterations; ++it) {  // iteration 0 reaches the plan's steady state
      ex.begin_iteration();
      for (op_index k = 0; k < t.ops.size(); ++k) {
        const auto& op = t.ops[k];
        ex.begin_op(k, op.reads, op.writes, op.name);
        const double seconds = *op.measured_seconds;
        dev.launch_kernel(ex.compute_stream(), [seconds] { work_for(seconds); });  // stands for the op's kernel
        ex.end_op(k);
        for (auto id : dies_after[k]) ex.release(id);
      }
      const auto st = ex.end_iteration();
      if (it == 0 && st.on_demand_evictions > 0 && margin_doublings < device_budget::max_margin_doublings &&
          warmups < 4) {
        ++margin_doublings;
        ++warmups;
        make();
        ex.follow(&t, &p, &layout);
        --it;  // warm up again with the new plan
        continue;
      }
      if (it == 0) continue;
      steps.push_back(st.step_ms);
      stalls.push_back(st.stall_ms);
      row.h2d = st.h2d_bytes;
      row.d2h = st.d2h_bytes;
      row.on_demand += st.on_demand_fetches + st.on_demand_evictions;
    }
    if (!chrome_file.empty()) write_session_chrome_trace(chrome_file, ex.timeline(), ex.memory_timeline(), row.budget);
  }
  row.measured_ms = median(steps);
  row.stall_ms = median(stalls);
  return row;
}

// The replayed ideal step, from --target-ms or from --scale: at least a millisecond (shorter ops
// than the clock and the copy threads can follow are no measurement) and at most ten seconds (a
// step that long is no faster to replay than to train, and the run takes iterations x policies x
// budgets of it).
constexpr double min_step_ms = 1, max_step_ms = 10000;

// The file --chrome-trace FILE writes for one run (FILE.<model>.<policy>.<ratio>.json); a trace
// file's path has its '/' made '_', so the file lands beside FILE.
std::string chrome_path(const replay_args& a, const std::string& name, const std::string& policy, double ratio) {
  std::string n = name;
  for (char& c : n)
    if (c == '/') c = '_';
  return a.chrome_file + "." + n + "." + policy + "." + std::to_string(ratio) + ".json";
}

// Everything the flags can get wrong, before any trace is built or run.
void check_flags(const replay_args& a) {
  if (a.scale_given && a.target_given)
    throw config_error("--scale and --target-ms both set the replayed step; give one of them");
  for (double r : a.ratios)
    if (!(r > 0 && r <= 1))
      throw config_error("--budget-ratio: cannot use " + format_real(r) + ": give a fraction of the peak live bytes above 0 and at most 1 (such as 0.25)");
  for (const auto& p : a.policies) (void)make_planner(p);
  std::vector<named_file> inputs = {{"--trace", a.trace_file}, {"--config", a.config.config_file}};
  std::vector<named_file> outputs = {{"--json", a.json_file}};
  if (!a.chrome_file.empty()) {
    std::vector<std::string> names = a.models;
    if (!a.trace_file.empty()) names.push_back(a.trace_file);
    for (const auto& n : names)
      for (const auto& p : a.policies)
        for (double r : a.ratios) {
          const auto path = chrome_path(a, n, p, r);
          check_writable(path, "--chrome-trace");
          outputs.push_back({"--chrome-trace", path});
        }
  }
  check_outputs(outputs, inputs);
}

int run(const replay_args& a) {
  check_flags(a);
  const auto base_hw = get_profile(a.hw);
  std::vector<std::pair<std::string, trace>> traces;
  if (!a.trace_file.empty()) traces.emplace_back(a.trace_file, load_trace(a.trace_file));
  for (const auto& m : a.models) {
    zoo_options zo;
    zo.batch = a.batch;
    zo.seq = a.seq;
    zo.layers = a.layers;
    trace t = make_model_trace(m, zo);
    // The executor runs every op on the device (Note [Host ops] in prefetch/plan.hpp): plan so.
    for (auto& op : t.ops) op.host_capable = false;
    traces.emplace_back(m, std::move(t));
  }
  if (traces.empty()) throw config_error("replay: give --model NAME (e.g. gpt2-small) or --trace FILE");
  // Each trace's scale (replay seconds per profile second), checked before the first line.
  std::vector<double> scales;
  for (const auto& [name, original] : traces) {
    double ideal = 0;
    for (const auto& op : original.ops) ideal += base_hw.op_seconds(op);
    if (!(ideal > 0)) throw config_error(name + ": the trace's ops take no time on " + base_hw.name + ", so there is nothing to replay");
    const double scale = a.scale_given ? a.scale : a.target_ms / 1e3 / ideal;
    const double step_ms = ideal * scale * 1e3;
    if (a.scale_given && !(step_ms >= min_step_ms && step_ms <= max_step_ms))
      throw config_error("--scale: cannot use " + format_real(a.scale) + ": it makes " + name + "'s ideal step " + format_real(step_ms) +
                         " ms; give a scale from " + format_real(min_step_ms / 1e3 / ideal) + " to " +
                         format_real(max_step_ms / 1e3 / ideal) + " (a step from " + number_text(min_step_ms) + " to " +
                         number_text(max_step_ms) + " ms), or leave it out and give --target-ms");
    scales.push_back(scale);
  }
  session_config defaults;
  defaults.cpu_device_memory = std::uint64_t{160} << 20;
  const session_config c = examples::load_config(a.config, defaults);
  c.validate();
  const std::uint64_t memory = c.cpu_device_memory;

  std::vector<result_row> rows;
  std::printf("%-12s %-9s %6s %10s %11s %12s %10s %9s %8s %9s %9s\n", "model", "policy", "budget", "bytes",
              "measured_ms", "predicted_ms", "lower_ms", "meas/pred", "meas/lb", "stall_ms", "on-demand");
  for (std::size_t ti = 0; ti < traces.size(); ++ti) {
    const auto& [name, original] = traces[ti];
    const auto rep0 = analyze(original);
    // Shrink bytes so the footprint fits the replay device with room to spare.
    const double shrink = std::max(1.0, static_cast<double>(rep0.peak_live_bytes) / (0.75 * static_cast<double>(memory)));
    const double scale = scales[ti];
    trace t = scaled(original, base_hw, shrink, scale);
    const auto rep = analyze(t);
    hw_profile hw = base_hw;
    hw.name = base_hw.name + " (replay)";
    hw.device_bytes = memory;
    hw.host_bytes = std::uint64_t{1} << 40;
    hw.compute_flops_per_s = base_hw.compute_flops_per_s / scale;
    hw.hbm_bytes_per_s = base_hw.hbm_bytes_per_s / scale;
    double link = a.link_gbps * 1e9;
    if (link <= 0) {
      // Transfers that can be hidden: fast enough that the least transfer the smallest budget
      // forces takes 40% of the step, and faster still (10% at a time) until the lower bound is
      // the ideal step at every budget measured, i.e. no order of the copies forces a wait.
      const double smallest = *std::min_element(a.ratios.begin(), a.ratios.end());
      hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = 1e12;
      const auto b = compute_bounds(t, rep, hw, static_cast<std::uint64_t>(smallest * static_cast<double>(rep.peak_live_bytes)));
      const double bytes = static_cast<double>(std::max(b.h2d_min_bytes, b.d2h_min_bytes));
      link = std::max(1e8, bytes / (0.4 * b.ideal_seconds));
      auto hidden = [&](double l) {
        hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = l;
        for (double r : a.ratios) {
          const auto budget = std::max<std::uint64_t>(static_cast<std::uint64_t>(r * static_cast<double>(rep.peak_live_bytes)),
                                                      rep.min_budget_bytes + rep.min_budget_bytes / 16);
          const auto bb = compute_bounds(t, rep, hw, budget);
          if (bb.lower_bound_seconds > bb.ideal_seconds * (1 + 1e-9)) return false;
        }
        return true;
      };
      for (int i = 0; i < 40 && !hidden(link); ++i) link *= 1.1;
    }
    hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = link;
    std::printf("# %s: %zu ops, footprint %s (bytes / %.0f), ideal step %.1f ms, link %.2f GB/s\n", name.c_str(),
                t.ops.size(), format_bytes(rep.peak_live_bytes).c_str(), shrink,
                [&] { double s = 0; for (const auto& op : t.ops) s += *op.measured_seconds; return s * 1e3; }(),
                link / 1e9);
    for (double ratio : a.ratios) {
      for (const auto& policy : a.policies) {
        const std::string chrome = a.chrome_file.empty() ? std::string() : chrome_path(a, name, policy, ratio);
        auto r = replay_one(t, rep, hw, policy, ratio, memory, a.iterations, chrome);
        r.model = name;
        std::printf("%-12s %-9s %6.3f %10s %11.1f %12.1f %10.1f %9.3f %8.3f %9.1f %9llu%s\n", name.c_str(),
                    policy.c_str(), ratio, format_bytes(r.budget).c_str(), r.measured_ms, r.predicted_ms,
                    r.lower_bound_ms, r.measured_ms / r.predicted_ms, r.measured_ms / r.lower_bound_ms, r.stall_ms,
                    static_cast<unsigned long long>(r.on_demand), r.feasible ? "" : "  (plan infeasible)");
        std::fflush(stdout);
        rows.push_back(r);
      }
    }
  }

  // Targets.
  int misses = 0;
  double worst_pred = 0, worst_auto = 0;
  for (const auto& r : rows) {
    if (!r.feasible) continue;
    worst_pred = std::max(worst_pred, std::abs(r.measured_ms / r.predicted_ms - 1.0));
    if (r.policy == "auto" && (r.ratio == 0.5 || r.ratio == 0.25)) worst_auto = std::max(worst_auto, r.measured_ms / r.lower_bound_ms);
  }
  const bool pred_ok = worst_pred <= 0.15;
  const bool auto_ok = worst_auto <= 1.10;
  std::printf("target: measured within 15%% of predicted (feasible plans): worst %.1f%%  %s\n", worst_pred * 100,
              pred_ok ? "PASS" : "MISS");
  if (worst_auto > 0)
    std::printf("target: auto measured <= 1.10x lower bound at budgets 1/2 and 1/4: worst %.3fx  %s\n", worst_auto,
                auto_ok ? "PASS" : "MISS");
  misses += pred_ok ? 0 : 1;
  misses += (worst_auto == 0 || auto_ok) ? 0 : 1;

  if (!a.json_file.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : rows) {
      j.push_back({{"model", r.model}, {"policy", r.policy}, {"budget_ratio", r.ratio}, {"budget_bytes", r.budget},
                   {"measured_ms", r.measured_ms}, {"predicted_ms", r.predicted_ms}, {"lower_bound_ms", r.lower_bound_ms},
                   {"ideal_ms", r.ideal_ms}, {"stall_ms", r.stall_ms}, {"h2d_bytes", r.h2d}, {"d2h_bytes", r.d2h},
                   {"on_demand", r.on_demand}, {"feasible", r.feasible}});
    }
    write_output(a.json_file, j.dump(2) + "\n", "--json");
  }
  return misses == 0 ? 0 : 1;
}

const command_registration registration{"replay", [](CLI::App& app, int& exit_code) {
  auto a = std::make_shared<replay_args>();
  auto* cmd = app.add_subcommand("replay", "run a trace for real on the cpu backend and compare with the simulator");
  cmd->add_option("--model", a->models, "zoo model(s), e.g. gpt2-small resnet50");
  cmd->add_option("--trace", a->trace_file, "trace JSON file");
  cmd->add_option("--hw", a->hw, "profile whose compute rate sets the op durations")->capture_default_str();
  cmd->add_option("--batch", a->batch, "batch size (zoo models)")->check(whole_number_in(0, max_shape));
  cmd->add_option("--seq", a->seq, "sequence length or image side (zoo models)")->check(whole_number_in(0, max_shape));
  cmd->add_option("--layers", a->layers, "transformer blocks (zoo models; 0 = the real depth)")->check(whole_number_in(0, max_layers));
  auto* scale = cmd->add_option("--scale", a->scale, "replay seconds per profile second (default: ideal step of --target-ms)")
                    ->check(positive_number);
  auto* target = cmd->add_option("--target-ms", a->target_ms, "ideal replay step when --scale is not given")
                     ->capture_default_str()
                     ->check(number_in(min_step_ms, max_step_ms));
  cmd->add_option("--link-gbps", a->link_gbps,
                  "replay link GB/s each way (default or 0: transfers that can be hidden: the lower bound is the ideal step)")
      ->check(number_in(0, 10000));
  examples::add_config_flags(*cmd, a->config, {"cpu_device_memory"});
  cmd->add_option("--budget-ratio", a->ratios, "budgets as fractions of peak live bytes")->capture_default_str();
  cmd->add_option("--policy", a->policies, "none, lms, vdnn, vdnn-conv, checkpoint, capuchin, auto")->capture_default_str();
  cmd->add_option("--iterations", a->iterations, "measured iterations (after one warm-up)")->capture_default_str()->check(whole_number_in(1, 1000));
  cmd->add_option("--json", a->json_file, "write rows as JSON")->check(writable_file);
  cmd->add_option("--chrome-trace", a->chrome_file, "write each run's real timeline to FILE.<model>.<policy>.<ratio>.json")->check(writable_file);
  cmd->callback([a, scale, target, &exit_code] {
    a->scale_given = scale->count() > 0;
    a->target_given = target->count() > 0;
    exit_code = run(*a);
  });
}};

}  // namespace
}  // namespace spillway::bench
