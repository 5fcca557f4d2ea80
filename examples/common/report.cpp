// Formatting of progress lines, summaries and the JSON report of a training run. Losses always
// go through "%.9g" so that equal text means equal bits.
#include "examples/common/report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/text_file.hpp"

namespace spillway::examples {

namespace {

std::string printf_string(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

double percent(std::uint64_t a, std::uint64_t b) { return b == 0 ? 0.0 : 100.0 * static_cast<double>(a) / static_cast<double>(b); }

}  // namespace

std::string format_loss(float loss) { return printf_string("%.9g", static_cast<double>(loss)); }

std::string format_step(int step, int steps, float loss, const iteration_report& r) {
  std::string line = printf_string("step %4d/%d  loss %-12s %9.1f ms  h2d %-11s d2h %-11s", step + 1, steps,
                                   format_loss(loss).c_str(), r.step_ms, format_bytes(r.h2d_bytes).c_str(),
                                   format_bytes(r.d2h_bytes).c_str());
  if (r.nvme_read_bytes + r.nvme_write_bytes > 0)
    line += printf_string(" nvme r %-11s w %-11s", format_bytes(r.nvme_read_bytes).c_str(),
                          format_bytes(r.nvme_write_bytes).c_str());
  line += printf_string(" stalls %zu (%.1f ms)", r.stalls.size(), r.stall_ms);
  line += r.planned ? "  [" + r.policy + "]" : "  [recording]";
  return line;
}

std::string format_header(const run_result& r) {
  std::string s = printf_string("model    %s, %.2fM parameters\n", r.model.c_str(), static_cast<double>(r.parameters) / 1e6);
  s += printf_string("run      backend %s, policy %s, device budget %s of %s device memory", r.backend.c_str(),
                     r.policy.c_str(), format_bytes(r.device_budget_bytes).c_str(),
                     format_bytes(r.device_memory_bytes).c_str());
  if (r.budget_ratio > 0)
    s += printf_string("\n         budget %g x the footprint from step %d on (step %d records the footprint at the above)",
                       r.budget_ratio, r.first_step + 2, r.first_step + 1);
  if (!r.resumed_from.empty())
    s += printf_string("\nresumed  from %s after step %d", r.resumed_from.c_str(), r.first_step);
  return s;
}

std::string format_summary(const run_result& r) {
  std::string s;
  s += printf_string("footprint     %s with everything resident; device budget %s (%.1f%% of footprint)\n",
                     format_bytes(r.footprint_bytes).c_str(), format_bytes(r.device_budget_bytes).c_str(),
                     percent(r.device_budget_bytes, r.footprint_bytes));
  s += printf_string("least budget  %s (largest single op's working set)\n", format_bytes(r.min_budget_bytes).c_str());
  if (r.budget_ratio > 0 && r.first_step == 0 && r.iterations.size() > 1) {
    // The recording step ran at the whole device; the budget holds from the next step on.
    std::uint64_t under = 0;
    for (std::size_t i = 1; i < r.iterations.size(); ++i) under = std::max(under, r.iterations[i].peak_device_bytes);
    s += printf_string("peak device   %s (%.1f%% of budget) from step 2 on; %s in the recording step, at the whole device\n",
                       format_bytes(under).c_str(), percent(under, r.device_budget_bytes),
                       format_bytes(r.iterations[0].peak_device_bytes).c_str());
  } else {
    s += printf_string("peak device   %s (%.1f%% of budget)\n", format_bytes(r.peak_device_bytes).c_str(),
                       percent(r.peak_device_bytes, r.device_budget_bytes));
  }
  s += printf_string("moved         host->device %s, device->host %s, nvme read %s, nvme write %s\n",
                     format_bytes(r.h2d_bytes).c_str(), format_bytes(r.d2h_bytes).c_str(),
                     format_bytes(r.nvme_read_bytes).c_str(), format_bytes(r.nvme_write_bytes).c_str());
  s += printf_string("plan misses   %llu fetches and %llu evictions on demand, %llu prefetches deferred, %llu "
                     "allocations refused for fragments (planned steps)\n",
                     static_cast<unsigned long long>(r.on_demand_fetches),
                     static_cast<unsigned long long>(r.on_demand_evictions),
                     static_cast<unsigned long long>(r.prefetches_deferred),
                     static_cast<unsigned long long>(r.fragmented_allocations));
  if (r.recomputes + r.host_ops > 0)
    s += printf_string("reruns        %llu runs again of recomputable ops, %llu ops on the host\n",
                       static_cast<unsigned long long>(r.recomputes), static_cast<unsigned long long>(r.host_ops));
  double total = 0;
  for (double ms : r.step_ms()) total += ms;
  s += printf_string("time          %.1f ms total, median step %.1f ms (without recording), stalls %.1f ms (%.1f%% overhead)\n",
                     total, r.median_step_ms(), r.stall_ms, total > 0 ? 100.0 * r.stall_ms / total : 0.0);
  if (!r.losses.empty())
    s += "loss          " + format_loss(r.losses.front()) + " -> " + format_loss(r.losses.back()) + "\n";
  if (!r.saved_to.empty()) s += printf_string("checkpoint    %s (after step %d)\n", r.saved_to.c_str(), r.saved_after);
  if (!r.chrome_trace.empty()) s += "chrome trace  " + r.chrome_trace + " (open in chrome://tracing or ui.perfetto.dev)\n";
  return s;
}

nlohmann::json report_json(const run_result& r) {
  // Each loss goes through its "%.9g" text: a double parsed from at most 9 digits prints back
  // as those digits, so the file shows the text, and equal text means equal float bits.
  nlohmann::json losses = nlohmann::json::array(), steps = nlohmann::json::array();
  for (float l : r.losses) losses.push_back(std::strtod(format_loss(l).c_str(), nullptr));
  for (const auto& it : r.iterations) {
    steps.push_back({{"iteration", it.iteration},
                     {"planned", it.planned},
                     {"policy", it.policy},
                     {"step_ms", it.step_ms},
                     {"planned_step_ms", it.planned_step_ms},
                     {"stall_ms", it.stall_ms},
                     {"stalls", it.stalls.size()},
                     {"h2d_bytes", it.h2d_bytes},
                     {"d2h_bytes", it.d2h_bytes},
                     {"nvme_read_bytes", it.nvme_read_bytes},
                     {"nvme_write_bytes", it.nvme_write_bytes},
                     {"peak_device_bytes", it.peak_device_bytes},
                     {"on_demand_fetches", it.on_demand_fetches},
                     {"on_demand_evictions", it.on_demand_evictions},
                     {"prefetches_deferred", it.prefetches_deferred},
                     {"fragmented_allocations", it.fragmented_allocations},
                     {"recomputes", it.recomputes},
                     {"host_ops", it.host_ops},
                     {"layout", it.layout},
                     {"layout_misses", it.layout_misses}});
  }
  return {{"model", r.model},
          {"parameters", r.parameters},
          {"backend", r.backend},
          {"policy", r.policy},
          {"first_step", r.first_step},
          {"losses", losses},
          {"step_ms", r.step_ms()},
          {"median_step_ms", r.median_step_ms()},
          {"footprint_bytes", r.footprint_bytes},
          {"min_budget_bytes", r.min_budget_bytes},
          {"device_budget_bytes", r.device_budget_bytes},
          {"device_memory_bytes", r.device_memory_bytes},
          {"peak_device_bytes", r.peak_device_bytes},
          {"h2d_bytes", r.h2d_bytes},
          {"d2h_bytes", r.d2h_bytes},
          {"nvme_read_bytes", r.nvme_read_bytes},
          {"nvme_write_bytes", r.nvme_write_bytes},
          {"stall_ms", r.stall_ms},
          {"on_demand_fetches", r.on_demand_fetches},
          {"on_demand_evictions", r.on_demand_evictions},
          {"prefetches_deferred", r.prefetches_deferred},
          {"fragmented_allocations", r.fragmented_allocations},
          {"recomputes", r.recomputes},
          {"host_ops", r.host_ops},
          {"chrome_trace", r.chrome_trace},
          {"steps", steps}};
}

void write_report(const run_result& r, const std::string& path) {
  offload::write_text_file(path, report_json(r).dump(2) + "\n", "the report");
}

}  // namespace spillway::examples
