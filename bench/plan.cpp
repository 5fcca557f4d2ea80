// spillway-bench plan: every swap policy at every budget on a simulated GPU: step time against
// ideal and lower bound, stalls, bytes per tier, planner time; zoo-wide targets with PASS/MISS.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "allocator/device_budget.hpp"
#include "bench/command.hpp"
#include "bench/fit_times.hpp"
#include "bench/outputs.hpp"
#include "bench/plan_host.hpp"
#include "bench/plan_ranks.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/fit_plan.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "offload/sim_waits.hpp"
#include "offload/simulator.hpp"
#include "offload/trace_json.hpp"
#include "offload/zoo.hpp"

namespace spillway::bench {

namespace {
using namespace spillway::offload;
using json = nlohmann::json;

struct plan_args {
  std::string model, trace_file;
  std::vector<std::string> hw;
  std::uint32_t batch = 0, seq = 0, layers = 0, hidden = 0, heads = 0;
  std::string precision = "default";
  bool clip = false;
  std::string largest;
  std::string host_memory, nvme;
  bool paper = false;
  std::vector<std::string> budgets;
  std::vector<double> ratios;
  std::vector<std::string> policies;
  std::string json_file, svg_file, chrome_file;
  bool report = false;
  std::size_t waits = 0;  // --waits: the longest waits of each row's compute stream to print
  double fit_step_ms = 0;  // --fit-step-ms: op times from flops and bytes, fitted to this step
  bool packed = false;     // --packed: also the plan a Session would follow (fit_plan)
  ranks_args dp;  // --ranks and its knobs (bench/plan_ranks.hpp)
};

struct row {
  std::string model, hw, policy;
  std::uint64_t budget = 0, min_budget = 0, peak_live = 0;
  double ratio = 0;  // budget / peak live
  bool below_min = false;
  bool feasible = false;
  sim_result sim;
  bounds b;
  double plan_ms = 0;
  double model_tflops = 0;     // 6 x parameters x tokens / step (0: not a zoo model)
  double hardware_tflops = 0;  // the trace's flops plus the reruns' / step
  std::string note;
  // --packed (offload/fit_plan.hpp): the plan a Session follows, made for the highest budget
  // whose packed layout fits, its simulated step and whether any packing fit.
  bool packed = false, packed_fits = false, packed_in_order = false;
  std::uint64_t packed_budget = 0;
  double packed_ms = 0;
};

double ms(double s) { return s * 1e3; }
double gib(std::uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

json row_json(const row& r) {
  json j = {{"model", r.model},
          {"hw", r.hw},
          {"policy", r.policy},
          {"budget_bytes", r.budget},
          {"budget_ratio", r.ratio},
          {"min_budget_bytes", r.min_budget},
          {"peak_live_bytes", r.peak_live},
          {"step_ms", ms(r.sim.step_seconds)},
          {"ideal_ms", ms(r.b.ideal_seconds)},
          {"lower_bound_ms", ms(r.b.lower_bound_seconds)},
          {"state_bound_ms", ms(r.b.state_bound_seconds)},
          {"stall_ms", ms(r.sim.stall_seconds)},
          {"recompute_ms", ms(r.sim.recompute_seconds)},
          {"recomputes", r.sim.recomputes},
          {"peak_device_bytes", r.sim.peak_device_bytes},
          {"peak_host_bytes", r.sim.peak_host_bytes},
          {"h2d_bytes", r.sim.h2d_bytes},
          {"d2h_bytes", r.sim.d2h_bytes},
          {"nvme_read_bytes", r.sim.nvme_read_bytes},
          {"nvme_write_bytes", r.sim.nvme_write_bytes},
          {"plan_ms", r.plan_ms},
          {"model_tflops", r.model_tflops},
          {"hardware_tflops", r.hardware_tflops},
          {"host_ms", ms(r.sim.host_seconds)},
          {"host_ops", r.sim.host_ops},
          {"feasible", r.feasible},
          {"violations", r.sim.violation_count},
          {"note", r.note}};
  if (r.packed) {
    j["packed_budget_bytes"] = r.packed_budget;
    j["packed_step_ms"] = r.packed_ms;
    j["packed_fits"] = r.packed_fits;
    j["packed_in_order"] = r.packed_in_order;
  }
  return j;
}

void print_header() {
  std::printf("%-11s %-10s %-12s %10s %5s %10s %7s %7s %7s %9s %8s %9s %9s %9s %9s %8s %6s %6s %s\n", "model", "hw", "policy",
              "budget", "ratio", "step_ms", "/ideal", "/lb", "/state", "stall_ms", "rerun_ms", "peak_GiB", "h2d_GiB", "d2h_GiB",
              "nvme_GiB", "plan_ms", "mTFLOP", "hTFLOP", "ok");
}

void print_row(const row& r) {
  if (r.below_min) {
    std::printf("%-11s %-10s %-12s %9.2fG %5.3f  budget below the least any plan needs (%s)\n", r.model.c_str(),
                r.hw.c_str(), r.policy.c_str(), gib(r.budget), r.ratio, format_bytes(r.min_budget).c_str());
    return;
  }
  std::printf("%-11s %-10s %-12s %9.2fG %5.3f %10.2f %7.3f %7.3f %7.3f %9.2f %8.2f %9.2f %9.2f %9.2f %9.2f %8.1f %6.1f %6.1f %s\n",
              r.model.c_str(), r.hw.c_str(), r.policy.c_str(), gib(r.budget), r.ratio, ms(r.sim.step_seconds),
              r.sim.step_seconds / r.b.ideal_seconds, r.sim.step_seconds / r.b.lower_bound_seconds,
              r.sim.step_seconds / std::max(r.b.ideal_seconds, r.b.state_bound_seconds),
              ms(r.sim.stall_seconds), ms(r.sim.recompute_seconds), gib(r.sim.peak_device_bytes), gib(r.sim.h2d_bytes), gib(r.sim.d2h_bytes),
              gib(r.sim.nvme_read_bytes + r.sim.nvme_write_bytes), r.plan_ms, r.model_tflops, r.hardware_tflops,
              r.feasible ? "yes" : "NO");
  if (r.packed)
    std::printf("  packed: planned for %s (%.3f of the budget) %s, step %.2f ms (%.3fx the row's)\n",
                format_bytes(r.packed_budget).c_str(), static_cast<double>(r.packed_budget) / static_cast<double>(r.budget),
                !r.packed_fits         ? "and no packing fits (the executor places by best fit)"
                : r.packed_in_order ? "and its layout fits in the executor's order alone (the step counts its waits for bytes copies out still hold)"
                                    : "and its layout fits",
                r.packed_ms,
                r.packed_ms / ms(r.sim.step_seconds));
}

// --waits: where a row's step goes, phase by phase, and the longest waits of its compute stream
// with the copies behind them (offload/sim_waits.hpp).
void print_waits(const row& r, const trace& t, std::size_t most) {
  if (r.below_min) return;
  std::printf("  %s at %s:", r.policy.c_str(), format_bytes(r.budget).c_str());
  const char* sep = "";
  for (const auto& p : phase_uses(t, r.sim)) {
    const double len = p.end - p.start;
    if (len < 1e-5) continue;  // under 10 us: no share worth printing
    std::printf("%s %s %.2f ms (compute %.0f%%, copies in %.0f%%, copies out %.0f%%)", sep, std::string(p.name).c_str(), ms(len),
                100 * p.compute / len, 100 * p.h2d / len, 100 * p.d2h / len);
    sep = ";";
  }
  const auto waits = waited_copies(r.sim, 0);
  double waited = 0;
  for (const auto& w : waits) waited += w.seconds;
  std::printf("\n    the compute stream waits %.2f ms for copies in all", ms(waited));
  if (waits.empty() || most == 0) {
    std::printf("\n");
    return;
  }
  std::printf("; the longest waits:\n");
  for (std::size_t i = 0; i < std::min(most, waits.size()); ++i) {
    const auto& w = waits[i];
    std::printf("    %8.3f ms before %sop %u '%s':", ms(w.seconds), w.rerun ? "the rerun of " : "", w.op, t.ops[w.op].name.c_str());
    for (std::size_t c = 0; c < w.copies.size(); ++c) {
      const auto k = w.tracks[c];
      const char* what = k == sim_track::h2d ? "copy in" : k == sim_track::d2h ? "copy out" : k == sim_track::nvme_read ? "NVMe read" : "NVMe write";
      std::printf("%s %s of '%s' (%s)", c ? "," : "", what, t.tensors[w.copies[c]].name.c_str(),
                  format_bytes(t.tensors[w.copies[c]].bytes).c_str());
    }
    std::printf("\n");
  }
}

// Chrome trace (Perfetto): one process per row, tracks compute/h2d/d2h/nvme, a memory counter.
void add_chrome(json& events, int pid, const row& r, const trace& t) {
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                    {"args", {{"name", r.model + " " + r.hw + " " + r.policy + " @ " + format_bytes(r.budget)}}}});
  for (int k = 0; k < sim_track_count; ++k)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", k},
                      {"args", {{"name", std::string(to_string(static_cast<sim_track>(k)))}}}});
  for (const auto& e : r.sim.timeline) {
    const bool op = e.track == sim_track::compute || e.track == sim_track::recompute || e.track == sim_track::host ||
                    e.track == sim_track::network;
    events.push_back({{"name", op ? t.ops[e.id].name : t.tensors[e.id].name},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", static_cast<int>(e.track)},
                      {"ts", e.start * 1e6},
                      {"dur", (e.end - e.start) * 1e6},
                      {"args", {{"bytes", e.bytes}}}});
  }
  for (const auto& m : r.sim.memory)
    events.push_back({{"name", "device memory"}, {"ph", "C"}, {"pid", pid}, {"ts", m.at_us},
                      {"args", {{"allocated", m.bytes}, {"budget", r.budget}}}});
}

std::string svg_of(const std::vector<row>& rows) {
  std::map<std::string, std::vector<const row*>> lines;
  double xmax = 0, ymax = 0;
  for (const auto& r : rows) {
    if (r.below_min || !r.feasible) continue;
    lines[r.model + " " + r.hw + " " + r.policy].push_back(&r);
    xmax = std::max(xmax, gib(r.budget));
    ymax = std::max(ymax, ms(r.sim.step_seconds));
  }
  const double W = 800, H = 500, L = 70, B = 50, R = 220, T = 20;
  auto X = [&](double v) { return L + v / (xmax > 0 ? xmax : 1) * (W - L - R); };
  auto Y = [&](double v) { return H - B - v / (ymax > 0 ? ymax : 1) * (H - B - T); };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  o << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double xv = xmax * i / 4, yv = ymax * i / 4;
    o << "<text x=\"" << X(xv) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">" << std::round(xv * 10) / 10
      << "</text>\n<text x=\"" << L - 6 << "\" y=\"" << Y(yv) + 4 << "\" text-anchor=\"end\">" << std::round(yv)
      << "</text>\n";
  }
  o << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">device budget (GiB)</text>\n";
  o << "<text x=\"15\" y=\"" << H / 2 << "\" transform=\"rotate(-90 15 " << H / 2
    << ")\" text-anchor=\"middle\">simulated step time (ms)</text>\n";
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  int i = 0;
  for (auto& [name, pts] : lines) {
    std::sort(pts.begin(), pts.end(), [](auto a, auto b) { return a->budget < b->budget; });
    const char* c = colors[i % 8];
    o << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"2\" points=\"";
    for (auto* p : pts) o << X(gib(p->budget)) << "," << Y(ms(p->sim.step_seconds)) << " ";
    o << "\"/>\n";
    for (auto* p : pts)
      o << "<circle cx=\"" << X(gib(p->budget)) << "\" cy=\"" << Y(ms(p->sim.step_seconds)) << "\" r=\"3\" fill=\"" << c
        << "\"/>\n";
    o << "<text x=\"" << W - R + 10 << "\" y=\"" << T + 16 * i + 10 << "\" fill=\"" << c << "\">" << name << "</text>\n";
    ++i;
  }
  o << "</svg>\n";
  return o.str();
}

struct runner {
  bool timeline = false;
  bool packed = false;
  std::vector<row> rows;

  void run(const std::string& model, const trace& t, const hw_profile& hw, const std::vector<std::uint64_t>& budgets,
           const lifetime_report& rep, const std::vector<std::string>& policies, double model_flops = 0) {
    double trace_flops = 0;
    for (const auto& op : t.ops) trace_flops += op.flops;
    for (auto budget : budgets) {
      const auto b = compute_bounds(t, rep, hw, budget);
      for (const auto& pol : policies) {
        row r;
        r.model = model;
        r.hw = hw.name;
        r.policy = pol;
        r.budget = budget;
        r.min_budget = rep.min_budget_bytes;
        r.peak_live = rep.peak_live_bytes;
        r.ratio = static_cast<double>(budget) / static_cast<double>(rep.peak_live_bytes);
        r.b = b;
        if (budget > hw.device_bytes) r.note = "budget above the profile's device memory (what-if)";
        if (budget < rep.min_budget_bytes) {
          r.below_min = true;
          r.note = "budget below the least any plan needs: op " + std::to_string(rep.min_budget_op) + " ('" +
                   t.ops[rep.min_budget_op].name + "') needs " + format_bytes(rep.min_budget_bytes) + " resident at once";
          rows.push_back(std::move(r));
          continue;
        }
        auto planner = make_planner(pol);
        const auto t0 = std::chrono::steady_clock::now();
        const plan p = planner->make_plan(t, rep, hw, budget);
        r.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        sim_options so;
        so.record_timeline = timeline;
        r.sim = simulate(t, p, hw, so);
        r.feasible = r.sim.feasible();
        double rerun_flops = 0;
        for (const auto& st : p.steps)
          for (op_index o : st.recomputes) rerun_flops += t.ops[o].flops;
        r.model_tflops = model_flops / r.sim.step_seconds / 1e12;
        r.hardware_tflops = (trace_flops + rerun_flops) / r.sim.step_seconds / 1e12;
        if (packed) {
          const auto fitted = fit_plan(*planner, t, rep, hw, device_budget(budget), device_budget::no_margin, {});
          r.packed = true;
          r.packed_fits = fitted.fits;
          r.packed_in_order = fitted.waits_for_addresses;
          r.packed_budget = fitted.p.budget_bytes;
          r.packed_ms = fitted.predicted_seconds * 1e3;
        }
        rows.push_back(std::move(r));
      }
    }
  }
};

zoo_options zoo_options_for(const plan_args& a) {
  zoo_options zo;
  zo.batch = a.batch;
  zo.seq = a.seq;
  zo.layers = a.layers;
  zo.hidden = a.hidden;
  zo.heads = a.heads;
  zo.precision = parse_zoo_precision(a.precision, "--precision");
  zo.clip_grad_norm = a.clip;
  return zo;
}

double model_flops(const std::string& model, const zoo_options& zo, const trace& t) {
  const auto size = zoo_size(model, zo, t);
  return 6.0 * static_cast<double>(size.parameters) * static_cast<double>(size.tokens);
}

std::vector<std::uint64_t> budgets_for(const plan_args& a, const lifetime_report& rep) {
  std::vector<std::uint64_t> out;
  for (const auto& s : a.budgets) out.push_back(parse_size(s, "--budget"));
  auto ratios = a.ratios;
  if (out.empty() && ratios.empty()) ratios = {0.5, 0.25, 0.125};
  for (double r : ratios) {
    const double bytes = static_cast<double>(rep.peak_live_bytes) * r;
    if (!(r > 0) || !std::isfinite(r) || bytes > static_cast<double>(max_size_bytes) || bytes < 1)
      throw config_error("--budget-ratio: cannot use " + format_real(r) + ": give a fraction of the peak live bytes (" +
                         format_bytes(rep.peak_live_bytes) + ") such as 0.5, greater than 0 and at most " +
                         format_real(static_cast<double>(max_size_bytes) / static_cast<double>(std::max<std::uint64_t>(1, rep.peak_live_bytes))));
    out.push_back(static_cast<std::uint64_t>(bytes));
  }
  return out;
}

std::vector<std::string> policies_for(const plan_args& a) {
  if (a.policies.empty() || std::find(a.policies.begin(), a.policies.end(), "all") != a.policies.end())
    return planner_names();
  return a.policies;
}

// The recomputation targets on h200 at budgets 1/4 and 1/8 of peak live bytes: ideal/step of
// auto on the GPT-2 models, bert-large and the ResNets (geometric mean), and auto's step against
// max(ideal, state bound) on every zoo model.
template <class Verdict>
void recompute_targets(const std::vector<row>& rows, Verdict& verdict) {
  const std::vector<std::string> activation_bound = {"gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl",
                                                     "bert-large", "resnet50", "resnet152"};
  double log_ideal = 0, log_state = 0, log_ideal_lb = 0, log_state_lb = 0;
  std::size_t n_ideal = 0, n_state = 0;
  double log_heaviest = 0, log_heaviest_lb = 0;  // the row that weighs most in the second mean
  std::string heaviest;
  for (const auto& r : rows) {
    if (r.policy != "auto" || r.hw != "h200" || r.below_min || !r.feasible) continue;
    if (std::abs(r.ratio - 0.25) > 1e-6 && std::abs(r.ratio - 0.125) > 1e-6) continue;
    const double step = r.sim.step_seconds;
    if (std::find(activation_bound.begin(), activation_bound.end(), r.model) != activation_bound.end()) {
      log_ideal += std::log(r.b.ideal_seconds / step);
      log_ideal_lb += std::log(r.b.ideal_seconds / r.b.lower_bound_seconds);
      ++n_ideal;
    }
    const double log_row = std::log(step / std::max(r.b.ideal_seconds, r.b.state_bound_seconds));
    const double log_row_lb = std::log(r.b.lower_bound_seconds / std::max(r.b.ideal_seconds, r.b.state_bound_seconds));
    log_state += log_row;
    if (heaviest.empty() || log_row > log_heaviest) {
      log_heaviest = log_row;
      log_heaviest_lb = log_row_lb;
      heaviest = r.model + " at " + format_bytes(r.budget);
    }
    log_state_lb += log_row_lb;
    ++n_state;
  }
  char buf[256];
  if (n_ideal == 0) {
    verdict(false, "ideal/step of auto on h200 at 1/4 and 1/8: no rows (run with --hw h200 and the default budgets)");
    return;
  }
  const double geo_ideal = std::exp(log_ideal / static_cast<double>(n_ideal));
  std::snprintf(buf, sizeof buf,
                "geometric mean of ideal/step for auto on h200 at 1/4 and 1/8 (gpt2-*, bert-large, resnet50/152; %zu rows) "
                "= %.3f (target >= 0.6)",
                n_ideal, geo_ideal);
  verdict(geo_ideal >= 0.6, buf);
  std::printf("      (the lower bound allows at most %.3f on these rows)\n", std::exp(log_ideal_lb / static_cast<double>(n_ideal)));
  const double geo_state = std::exp(log_state / static_cast<double>(n_state));
  std::snprintf(buf, sizeof buf,
                "geometric mean of auto step / max(ideal, state bound) on h200 at 1/4 and 1/8 (%zu rows) = %.3f (target <= 1.18)",
                n_state, geo_state);
  verdict(geo_state <= 1.18, buf);
  std::printf("      (the lower bound allows no less than %.3f on these rows)\n", std::exp(log_state_lb / static_cast<double>(n_state)));
  if (n_state > 1)
    std::printf("      (the row that weighs most: %s, %.3fx; the other %zu rows: %.3f)\n", heaviest.c_str(),
                std::exp(log_heaviest), n_state - 1, std::exp((log_state - log_heaviest) / static_cast<double>(n_state - 1)));
  // Whether the target is within reach without that row: the mean with it as planned and every
  // other row at its lower bound, which no plan for them beats.
  if (n_state > 1)
    std::printf("      (that row as planned, every other row at its lower bound: %.3f)\n",
                std::exp((log_heaviest + log_state_lb - log_heaviest_lb) / static_cast<double>(n_state)));
}

int run_zoo(const plan_args& a, runner& run) {
  const auto hws = a.hw.empty() ? std::vector<std::string>{"h200", "v100-16g"} : a.hw;
  const auto policies = policies_for(a);
  print_header();
  for (const auto& hwname : hws) {
    const auto hw = get_profile(hwname);
    for (const auto& model : zoo_model_names()) {
      const bool cnn = model == "vgg16" || model.rfind("resnet", 0) == 0;
      zoo_options zo = zoo_options_for(a);
      if (cnn) zo.layers = zo.hidden = zo.heads = 0;
      const auto t = make_model_trace(model, zo);
      const auto rep = analyze(t);
      const auto before = run.rows.size();
      run.run(model, t, hw, budgets_for(a, rep), rep, policies, model_flops(model, zo, t));
      for (auto i = before; i < run.rows.size(); ++i) print_row(run.rows[i]);
    }
  }
  // Targets.
  bool all_pass = true;
  auto verdict = [&](bool ok, const std::string& what) {
    std::printf("%s  %s\n", ok ? "PASS" : "MISS", what.c_str());
    all_pass = all_pass && ok;
  };
  std::map<std::tuple<std::string, std::string, std::uint64_t>, std::map<std::string, const row*>> by_case;
  for (const auto& r : run.rows) by_case[{r.model, r.hw, r.budget}][r.policy] = &r;
  std::size_t cases = 0, infeasible = 0, slower = 0;
  double log_sum = 0, worst = 0;
  std::string worst_case, slower_cases;
  for (const auto& [key, pols] : by_case) {
    auto it = pols.find("auto");
    if (it == pols.end() || it->second->below_min) continue;
    const row& au = *it->second;
    ++cases;
    if (!au.feasible) ++infeasible;
    for (const char* base : {"lms", "vdnn-all", "vdnn-conv", "checkpoint", "capuchin", "zero-offload"}) {
      auto b = pols.find(base);
      if (b == pols.end() || !b->second->feasible) continue;
      if (au.sim.step_seconds > b->second->sim.step_seconds * (1 + 1e-9)) {
        ++slower;
        slower_cases += " " + au.model + "/" + au.hw + "/" + std::to_string(au.ratio) + "<" + base;
      }
    }
    const double q = au.sim.step_seconds / au.b.lower_bound_seconds;
    log_sum += std::log(q);
    if (q > worst) {
      worst = q;
      worst_case = au.model + " on " + au.hw + " at " + format_bytes(au.budget);
    }
  }
  const double geo = cases ? std::exp(log_sum / static_cast<double>(cases)) : 0;
  std::printf("\ntargets over %zu cases (model x hw x budget with budget >= least any plan needs):\n", cases);
  verdict(infeasible == 0, "auto feasible wherever the budget allows: " + std::to_string(cases - infeasible) + "/" +
                               std::to_string(cases));
  verdict(slower == 0, "auto never slower than lms, vdnn, checkpoint, capuchin or zero-offload: " + std::to_string(slower) + " slower" +
                           slower_cases);
  recompute_targets(run.rows, verdict);
  char buf[256];
  std::snprintf(buf, sizeof buf, "geometric mean of auto step/lower_bound = %.4f (target <= 1.15)", geo);
  verdict(geo <= 1.15, buf);
  std::snprintf(buf, sizeof buf, "worst auto step/lower_bound = %.4f (target <= 1.5): %s", worst, worst_case.c_str());
  verdict(worst <= 1.5, buf);
  // Planner speed on a 10,000-op trace: GPT-2-small shapes with enough blocks.
  {
    zoo_options zo{0, 0, 1};
    const auto per_block = make_model_trace("gpt2-small", zo).ops.size();
    zo.layers = 2;
    const auto per_block2 = make_model_trace("gpt2-small", zo).ops.size();
    const auto step = per_block2 - per_block;
    zo.layers = static_cast<std::uint32_t>(1 + (10000 - std::min<std::size_t>(10000, per_block) + step - 1) / step);
    const auto t = make_model_trace("gpt2-small", zo);
    const auto rep = analyze(t);
    const auto hw = get_profile(hws.front());
    // The fastest of three runs: what the planner needs, less what other work on the machine took.
    double sec = 0;
    for (int run = 0; run < 3; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      (void)make_planner("auto")->make_plan(t, rep, hw, rep.peak_live_bytes / 4);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      sec = run == 0 ? s : std::min(sec, s);
    }
    std::snprintf(buf, sizeof buf,
                  "auto plans a %zu-op trace (gpt2-small, %u blocks, budget 1/4 of peak) in %.3f s, best of 3 (target < 1 s)",
                  t.ops.size(), zo.layers, sec);
    verdict(sec < 1.0, buf);
  }
  return all_pass ? 0 : 1;
}

// The longest step --fit-step-ms takes: an hour, far past the step of any model the zoo or a
// recorded trace describes (seconds), yet small enough that every op's time stays a number.
constexpr double max_fit_step_ms = 3.6e6;

// What a run of these flags writes, checked before any work: outputs that a mode does not write
// are refused rather than silently left out, no output is an input or another output.
void check_plan_outputs(const plan_args& a) {
  const char* mode = !a.largest.empty() ? "--largest" : a.paper ? "--zero-offload-paper" : a.dp.ranks > 0 ? "--ranks" : nullptr;
  if (mode) {
    for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--json", a.json_file}, {"--svg", a.svg_file}})
      if (!path.empty())
        throw config_error(std::string(flag) + ": " + mode + " prints its table and writes no " + flag +
                           " file; leave " + flag + " out (--chrome-trace works with --ranks)");
    if (!a.chrome_file.empty() && a.dp.ranks == 0)
      throw config_error(std::string("--chrome-trace: ") + mode + " writes no timeline; leave --chrome-trace out");
  }
  if (a.model == "zoo" && !a.chrome_file.empty())
    throw config_error("--chrome-trace: give one model (--model NAME or --trace FILE), not 'zoo'");
  std::vector<named_file> inputs = {{"--trace", a.trace_file}};
  for (const auto& h : a.hw)
    if (h.ends_with(".json")) inputs.push_back({"--hw", h});
  check_outputs({{"--json", a.json_file}, {"--svg", a.svg_file}, {"--chrome-trace", a.chrome_file}}, inputs);
}

int run_plan(const plan_args& a) {
  check_plan_outputs(a);
  if (a.fit_step_ms > max_fit_step_ms)
    throw config_error("--fit-step-ms: cannot use " + format_real(a.fit_step_ms) + ": give a step time above 0 and at most " +
                       number_text(max_fit_step_ms) + " ms (an hour)");
  // Every policy and profile named is checked before any trace is built or planned.
  for (const auto& p : a.policies)
    if (p != "all") (void)make_planner(p);
  for (const auto& h : a.hw) (void)get_profile(h);
  if (!a.largest.empty()) {
    if (a.largest != "gpt") throw config_error("--largest: '" + a.largest + "' is not a family to search (gpt)");
    largest_args la;
    la.hw = a.hw.empty() ? std::vector<std::string>{"v100-32g"} : a.hw;
    la.batch = a.batch ? a.batch : 4;
    la.seq = a.seq ? a.seq : 1024;
    la.host_memory = a.host_memory;
    la.nvme = a.nvme;
    la.policies = a.policies.empty() ? std::vector<std::string>{"zero-offload", "auto"} : a.policies;
    return run_largest(la);
  }
  if (a.paper) {
    paper_args pa;
    pa.batch = a.batch ? a.batch : 10;
    pa.seq = a.seq ? a.seq : 1024;
    pa.policies = a.policies.empty() ? std::vector<std::string>{"checkpoint", "zero-offload", "auto"} : a.policies;
    return run_paper(pa);
  }
  if (!a.host_memory.empty() || !a.nvme.empty())
    throw config_error("--host-memory and --nvme set the tiers for --largest; for other runs give a profile .json");
  if (a.dp.ranks > 0) {
    if (a.model == "zoo" || a.model.empty() == a.trace_file.empty())
      throw config_error("--ranks: give exactly one of --model (a zoo model, not 'zoo') and --trace");
    const auto zo = zoo_options_for(a);
    const trace t = a.trace_file.empty() ? make_model_trace(a.model, zo) : load_trace(a.trace_file);
    if (t.ops.empty()) throw config_error(a.trace_file + ": the trace has no ops, so there is nothing to plan");
    ranks_args dp = a.dp;
    dp.name = a.trace_file.empty() ? a.model : a.trace_file;
    dp.hw = a.hw;
    dp.budgets = a.budgets;
    dp.ratios = a.ratios;
    dp.policies = a.policies;
    dp.chrome_file = a.chrome_file;
    if (a.trace_file.empty()) {
      dp.model_flops = model_flops(a.model, zo, t);
      dp.tokens = zoo_size(a.model, zo, t).tokens;
    }
    return run_ranks(dp, t);
  }
  runner run;
  run.timeline = !a.chrome_file.empty() || a.waits > 0;
  run.packed = a.packed;
  int code = 0;
  std::vector<std::pair<std::string, trace>> traces;
  if (a.model == "zoo") {
    if (a.waits > 0) throw config_error("--waits: give one model (--model NAME or --trace FILE), not 'zoo'");
    if (a.fit_step_ms > 0) throw config_error("--fit-step-ms: give one trace (--trace FILE), not 'zoo'");
    code = run_zoo(a, run);
  } else {
    if (a.model.empty() == a.trace_file.empty()) throw config_error("give exactly one of --model and --trace");
    const auto zo = zoo_options_for(a);
    trace t = a.trace_file.empty() ? make_model_trace(a.model, zo) : load_trace(a.trace_file);
    const std::string name = a.trace_file.empty() ? a.model : a.trace_file;
    if (t.ops.empty()) throw config_error(name + ": the trace has no ops, so there is nothing to plan; give at least one op");
    const auto rep = analyze(t);
    if (a.report) std::cout << format_report(rep, t) << "\n";
    const auto budgets = budgets_for(a, rep);
    // A budget below the least any plan needs is a row that says so (feasible: false), and the
    // sweep goes on with the other budgets.
    print_header();
    const auto hws = a.hw.empty() ? std::vector<std::string>{"h200"} : a.hw;
    for (const auto& hwname : hws) {
      const auto hw = get_profile(hwname);
      const auto before = run.rows.size();
      if (a.fit_step_ms > 0) {
        const double f = fit_op_times(t, hw, a.fit_step_ms);
        std::printf("%s on %s: op times from flops and bytes, %.1f TFLOP/s and %.0f GB/s, %.2f ms in all\n", name.c_str(),
                    hw.name.c_str(), f / 1e12, hw.hbm_bytes_per_s / 1e9, a.fit_step_ms);
      }
      run.run(name, t, hw, budgets, rep, policies_for(a), a.trace_file.empty() ? model_flops(a.model, zo, t) : 0);
      for (auto i = before; i < run.rows.size(); ++i) {
        print_row(run.rows[i]);
        if (a.waits > 0) print_waits(run.rows[i], t, a.waits);
      }
    }
    if (!a.chrome_file.empty()) {
      json events = json::array();
      int pid = 0;
      for (const auto& r : run.rows)
        if (!r.below_min) add_chrome(events, pid++, r, t);
      write_output(a.chrome_file, json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n", "--chrome-trace");
    }
  }
  if (!a.json_file.empty()) {
    json rows = json::array();
    for (const auto& r : run.rows) rows.push_back(row_json(r));
    write_output(a.json_file, json{{"rows", rows}}.dump(1) + "\n", "--json");
  }
  if (!a.svg_file.empty()) write_output(a.svg_file, svg_of(run.rows), "--svg");
  return code;
}

command_registration reg("plan", [](CLI::App& app, int& exit_code) {
  auto a = std::make_shared<plan_args>();
  auto* sub = app.add_subcommand("plan", "plan and simulate swap policies over device budgets");
  sub->add_option("--model", a->model, "zoo model name, or 'zoo' for every model with the targets");
  sub->add_option("--trace", a->trace_file, "trace JSON file");
  sub->add_option("--hw", a->hw, "hardware profile name or .json (repeatable)");
  sub->add_option("--batch", a->batch, "batch size (0: model default)")->check(whole_number_in(0, max_shape));
  sub->add_option("--seq", a->seq, "sequence length / image side (0: model default)")->check(whole_number_in(0, max_shape));
  sub->add_option("--layers", a->layers, "transformer blocks (0: real depth)")->check(whole_number_in(0, max_layers));
  sub->add_option("--hidden", a->hidden, "transformer hidden size (0: the model's)")->check(whole_number_in(0, max_shape));
  sub->add_option("--heads", a->heads, "transformer attention heads, a divisor of the hidden size (0: the model's)")
      ->check(whole_number_in(0, max_shape));
  sub->add_option("--precision", a->precision, "default, fp32, bf16 or fp16 (16-bit: fp32 master weights and Adam moments)");
  sub->add_flag("--clip", a->clip, "clip gradients by their global norm (every update waits for the last gradient)");
  sub->add_option("--largest", a->largest,
                  "'gpt': the largest GPT (GPT-3 proportions) each policy trains at --batch and --seq on each --hw");
  sub->add_option("--host-memory", a->host_memory, "with --largest: the host tier's size, e.g. 2TB");
  sub->add_option("--nvme", a->nvme, "with --largest: the NVMe tier's size, e.g. 4TB (0 for none)");
  sub->add_flag("--zero-offload-paper", a->paper,
                "the ZeRO-Offload paper's 10B GPT (50 layers, hidden 4096) on v100-32g, with its targets");
  sub->add_option("--budget", a->budgets, "device budget, e.g. 8GiB (repeatable)");
  sub->add_option("--budget-ratio", a->ratios, "budget as a fraction of peak live bytes (repeatable)");
  sub->add_option("--policy", a->policies,
                  "none, lms, vdnn-all, vdnn-conv, checkpoint, capuchin, zero-offload, auto or all (repeatable)");
  sub->add_option("--json", a->json_file, "write the rows as JSON")->check(writable_file);
  sub->add_option("--svg", a->svg_file, "plot step time against budget, one line per policy")->check(writable_file);
  sub->add_option("--chrome-trace", a->chrome_file, "write the simulated timelines (Perfetto / chrome://tracing)")->check(writable_file);
  sub->add_flag("--report", a->report, "print the lifetime report of the trace");
  sub->add_flag("--packed", a->packed,
                "also plan each row as a Session does: for the highest budget whose packed layout fits (fit_plan)");
  sub->add_option("--waits", a->waits,
                  "under each row: the share of each phase its streams are busy, and its N longest compute waits with the copies behind them")
      ->check(whole_number);
  sub->add_option("--fit-step-ms", a->fit_step_ms,
                  "op times from each op's flops and bytes on the profile (HBM rate; at least 5 us), the compute rate "
                  "fitted so the ops add up to this many ms: plan a trace recorded elsewhere for a machine whose "
                  "resident step is known")
      ->check(positive_number);
  sub->add_option("--ranks", a->dp.ranks,
                  "data parallel over N ranks (ZeRO; per-rank batch fixed): predict the step and the scaling efficiency")
      ->check(whole_number_in(1, max_ranks));
  sub->add_option("--ranks-per-node", a->dp.ranks_per_node, "with --ranks: ranks sharing one host (its CPU, memory, NVMe)")
      ->check(whole_number_in(1, max_ranks));
  sub->add_option("--network", a->dp.network, "with --ranks: each rank's network, e.g. 400Gb/s, 50GB/s, unlimited (default: the profile's)");
  sub->add_option("--network-latency-us", a->dp.network_latency_us, "with --ranks: latency of one ring step (default: the profile's)")
      ->check(number_in(0, max_network_latency_us));
  sub->add_option("--zero", a->dp.zero, "with --ranks: ZeRO stage, 1 (all-reduce) or 2 (reduce-scatter; default)")
      ->check(whole_number_in(1, 2));
  sub->add_option("--bucket", a->dp.bucket, "with --ranks: least bytes per collective (default 200MB)");
  sub->add_option("--gather", a->dp.gather, "with --ranks: all-gather parameters before_use (default) or after_step");
  sub->add_option("--link-share", a->dp.link_shares,
                  "with --ranks: shares of the PCIe link each policy plans its copies for (repeatable; default 1 0.5 0.35 0.25 0.15 0.1)");
  sub->add_option("--early-step-share", a->dp.early_step_shares,
                  "with --ranks: shares of the parameters stepped and gathered in the backward pass to try (repeatable; default 0 0.25 0.5 0.75 1)");
  sub->add_option("--early-step-lag", a->dp.early_step_lag,
                  "with --ranks: buckets an early step waits after its gradients' collective (default 8)")
      ->check(whole_number_in(1, max_buckets));
  sub->add_option("--gather-ahead", a->dp.gather_ahead, "with --ranks and --gather before_use: buckets gathered ahead (default 2)")
      ->check(whole_number_in(0, max_buckets));
  sub->callback([a, &exit_code] { exit_code = run_plan(*a); });
});

}  // namespace

}  // namespace spillway::bench
