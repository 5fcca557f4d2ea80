// The training harness: footprint probe for ratio budgets, the step loop, and the totals over
// the steps that the progress lines, the summary and the bench read.
#include "examples/common/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway::examples {

std::vector<double> run_result::step_ms() const {
  std::vector<double> v;
  v.reserve(iterations.size());
  for (const auto& r : iterations) v.push_back(r.step_ms);
  return v;
}

double run_result::median_step_ms() const {
  auto v = step_ms();
  if (v.empty()) return 0;
  if (v.size() > 1) v.erase(v.begin());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

std::string format_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", r);
  return buf;
}

// Waits for the device's queued work when it leaves scope, so that a model never dies while
// its kernels and uploads still read its host buffers (an exception mid-step leaves work queued).
class drain_on_exit {
 public:
  explicit drain_on_exit(Session& s) : s_(s) {}
  ~drain_on_exit() {
    try {
      s_.device().synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the error already in flight is the one to report
    }
  }
  drain_on_exit(const drain_on_exit&) = delete;
  drain_on_exit& operator=(const drain_on_exit&) = delete;

 private:
  Session& s_;
};

struct probe_result {
  std::uint64_t footprint = 0;
  std::uint64_t least = 0;
};

// One step of a model in a Session of its own, to learn the footprint before the real run.
probe_result probe_footprint(const example_options& o, const model_factory& make) {
  session_config c = make_session_config(o, o.device_budget);
  c.chrome_trace.clear();  // the real run writes the trace
  Session s(c);
  auto m = make();
  drain_on_exit drain(s);
  m->build(s);
  s.begin_iteration();
  (void)m->train_step(s, 0);
  (void)s.end_iteration();
  return {s.footprint_bytes(), s.least_budget_bytes()};
}

}  // namespace

run_result train(const example_options& o, const model_factory& make, const step_observer& on_step,
                 const start_observer& on_start) {
  o.validate();
  run_result r;
  std::uint64_t budget = o.device_budget;
  if (o.budget_ratio > 0) {
    const probe_result p = probe_footprint(o, make);
    r.footprint_bytes = p.footprint;
    r.min_budget_bytes = p.least;
    r.probed_footprint = true;
    budget = static_cast<std::uint64_t>(std::llround(o.budget_ratio * static_cast<double>(r.footprint_bytes)));
    if (budget < p.least)
      throw config_error("--budget-ratio " + format_ratio(o.budget_ratio) + " gives a device budget of " +
                         format_bytes(budget) + " (of a " + format_bytes(p.footprint) +
                         " footprint), below the least any plan needs: " + format_bytes(p.least) +
                         " (the largest single op's working set)");
  }
  Session s(make_session_config(o, budget));
  auto m = make();
  drain_on_exit drain(s);
  m->build(s);
  r.model = m->describe();
  r.parameters = m->parameter_count();
  r.backend = to_string(s.device().properties().backend);
  r.policy = o.policy;
  r.device_budget_bytes = s.device_budget();
  r.device_memory_bytes = s.device().properties().total_memory;
  if (on_start) on_start(r);

  for (int step = 0; step < o.steps; ++step) {
    s.begin_iteration();
    const float loss = m->train_step(s, step);
    const iteration_report rep = s.end_iteration();
    r.losses.push_back(loss);
    r.iterations.push_back(rep);
    r.peak_device_bytes = std::max(r.peak_device_bytes, rep.peak_device_bytes);
    r.h2d_bytes += rep.h2d_bytes;
    r.d2h_bytes += rep.d2h_bytes;
    r.nvme_read_bytes += rep.nvme_read_bytes;
    r.nvme_write_bytes += rep.nvme_write_bytes;
    if (rep.planned) {  // the recording step runs on demand by design
      r.on_demand_fetches += rep.on_demand_fetches;
      r.on_demand_evictions += rep.on_demand_evictions;
      r.prefetches_deferred += rep.prefetches_deferred;
      r.fragmented_allocations += rep.fragmented_allocations;
    }
    r.stall_ms += rep.stall_ms;
    if (step == 0) {
      r.footprint_bytes = s.footprint_bytes();
      r.min_budget_bytes = s.least_budget_bytes();
    }
    if (on_step) on_step(step, loss, rep);
  }
  if (!o.chrome_trace.empty()) {
    s.write_chrome_trace(o.chrome_trace);
    r.chrome_trace = o.chrome_trace;
  }
  return r;
}

}  // namespace spillway::examples
