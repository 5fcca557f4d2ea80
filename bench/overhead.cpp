// spillway-bench overhead: the host's own cost per op. On a GPU the host must stay ahead of
// kernels that run for tens of microseconds, so what the Session and executor spend per op,
// beyond the Device calls themselves, bounds the smallest op that can be overlapped. Ops here
// do no work; the figure is the launching thread's CPU time per op less its CPU time inside
// Device calls, set beside an empty kernel launch on the same backend in the same run. The CPU
// time inside Device calls is read from the thread's CPU clock around each call, less the
// measured cost of those reads (bench/timed_device.hpp).
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "examples/common/flags.hpp"
#include "bench/timed_device.hpp"
#include "allocator/device_budget.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/session_hooks.hpp"
#include "offload/swap_policy.hpp"

namespace spillway::bench {
namespace {

struct overhead_args {
  examples::config_flags config;     // --config and the session settings' flags
  session_config base;               // loaded from them (load_base) before the run
  int layers = 100;                  // 3 ops and 3 tensors per layer per iteration
  std::string tensor_size = "64KiB";
  int ops = 10000;                   // measured ops per run
  int runs = 5;
  std::vector<std::string> policies = {"none", "auto"};
  double budget_ratio = 0.25;        // of the footprint, for policies other than none
  double target_none_us = 5;
  double target_planned_us = 10;
  std::string json;
};

/// Instructions retired by the calling thread in user space, where the kernel lets us count.
class instruction_counter {
 public:
  instruction_counter() {
    perf_event_attr a{};
    a.type = PERF_TYPE_HARDWARE;
    a.size = sizeof a;
    a.config = PERF_COUNT_HW_INSTRUCTIONS;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    fd_ = static_cast<int>(::syscall(SYS_perf_event_open, &a, 0, -1, -1, 0));
  }
  ~instruction_counter() {
    if (fd_ >= 0) ::close(fd_);
  }
  instruction_counter(const instruction_counter&) = delete;
  instruction_counter& operator=(const instruction_counter&) = delete;
  [[nodiscard]] std::optional<std::uint64_t> read() const {
    std::uint64_t v = 0;
    if (fd_ < 0 || ::read(fd_, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) return std::nullopt;
    return v;
  }

 private:
  int fd_ = -1;
};

struct run_figures {
  double host_us_per_op = 0;
  double total_us_per_op = 0;
  double device_calls_per_op = 0;
  std::optional<double> instructions_per_op;
};

/// A model of `layers` layers: forward (param, activation in -> activation out), backward
/// (activation, param -> gradient) and an optimizer step (gradient, param -> param) each.
class zero_model {
 public:
  zero_model(Session& s, int layers, std::uint64_t bytes) : s_(s), layers_(layers), bytes_(bytes) {
    for (int i = 0; i < layers; ++i) {
      params_.push_back(s.add_persistent("layer" + std::to_string(i) + ".weight", bytes, tensor_kind::parameter));
      grads_.push_back(s.add_persistent("layer" + std::to_string(i) + ".weight.grad", bytes, tensor_kind::gradient));
    }
  }
  [[nodiscard]] int ops_per_iteration() const { return 3 * layers_; }

  void iteration() {
    s_.begin_iteration();
    std::vector<tensor_handle> acts;
    acts.reserve(static_cast<std::size_t>(layers_));
    for (int i = 0; i < layers_; ++i) {
      acts.push_back(s_.add_transient("layer" + std::to_string(i) + ".out", bytes_));
      if (i == 0) {
        auto op = s_.op("layer0.forward", {params_[0]}, {acts[0]});
      } else {
        auto op = s_.op("layer.forward", {params_[i], acts[i - 1]}, {acts[i]});
      }
    }
    for (int i = layers_ - 1; i >= 0; --i) {
      {
        auto op = s_.op("layer.backward", {acts[static_cast<std::size_t>(i)], params_[i]}, {grads_[i]});
      }
      s_.release(acts[static_cast<std::size_t>(i)]);
    }
    for (int i = 0; i < layers_; ++i) {
      auto op = s_.op("layer.adam", {grads_[i], params_[i]}, {params_[i]});
    }
    (void)s_.end_iteration();
  }

 private:
  Session& s_;
  int layers_;
  std::uint64_t bytes_;
  std::vector<tensor_handle> params_, grads_;
};

/// The Session settings of the run: this benchmark's defaults (cpu backend, a 12 GB/s link on
/// it) < --config < SPILLWAY_* < flags; validated before any work.
// --layers: at most 10,000 (30,000 ops an iteration), a hundred times the default and far past
// any real model's depth; each run records and plans an iteration of them, so the bound keeps a
// run to seconds, where 10^8 layers allocated until the machine ran out of memory.
constexpr std::uint64_t max_overhead_layers = 10000;

session_config load_base(const examples::config_flags& flags) {
  session_config d;
  d.backend = "cpu";
  d.link_gbps = 12;
  session_config c = examples::load_config(flags, d);
  if (c.backend != "cpu" && c.source_of("link_gbps") == "link_gbps") c.link_gbps = 0;  // measured on a GPU
  c.validate();
  return c;
}

session_config config_for(const overhead_args& a, const std::string& policy, std::uint64_t budget) {
  session_config c = a.base;
  c.policy = policy;
  c.device_budget = budget;
  return c;
}

std::uint64_t footprint_of(const overhead_args& a) {
  Session s(config_for(a, "none", 0));
  zero_model m(s, a.layers, parse_size(a.tensor_size, "--tensor-size"));
  m.iteration();
  return s.footprint_bytes();
}

run_figures measure(const overhead_args& a, const std::string& policy, std::uint64_t budget) {
  session_hooks hooks;
  hooks.wrap_device = [](std::unique_ptr<Device> d) -> std::unique_ptr<Device> {
    return std::make_unique<timed_device>(std::move(d));
  };
  Session s(config_for(a, policy, budget), hooks);
  zero_model m(s, a.layers, parse_size(a.tensor_size, "--tensor-size"));
  for (int i = 0; i < 3; ++i) m.iteration();  // record, plan, settle
  const int iterations = std::max(1, (a.ops + m.ops_per_iteration() - 1) / m.ops_per_iteration());
  const double ops = static_cast<double>(iterations) * m.ops_per_iteration();
  const double probe = timed_device::probe_ns();
  instruction_counter counter;
  const auto i0 = counter.read();
  const auto cpu0 = thread_cpu_ns();
  const auto in0 = timed_device::inside_ns();
  const auto calls0 = timed_device::calls();
  for (int i = 0; i < iterations; ++i) m.iteration();
  const auto cpu = static_cast<double>(thread_cpu_ns() - cpu0);
  const auto inside = static_cast<double>(timed_device::inside_ns() - in0);
  const auto calls = static_cast<double>(timed_device::calls() - calls0);
  const auto i1 = counter.read();
  run_figures r;
  // Each timed call's clock reads add about one read inside the call and one outside it
  // (bench/timed_device.hpp): both come off.
  r.total_us_per_op = std::max(0.0, cpu - calls * probe) / 1e3 / ops;
  r.host_us_per_op = std::max(0.0, cpu - inside - calls * probe) / 1e3 / ops;
  r.device_calls_per_op = calls / ops;
  if (i0 && i1) r.instructions_per_op = static_cast<double>(*i1 - *i0) / ops;
  return r;
}

double empty_launch_us(const overhead_args& a) {
  device_options o;
  o.cpu_device_memory = a.base.cpu_device_memory;
  o.strict.callback_seed = a.base.cpu_callback_seed;
  auto dev = make_device(a.base.backend, o);
  owned_stream s(*dev);
  constexpr int n = 10000;
  const auto t0 = thread_cpu_ns();
  for (int i = 0; i < n; ++i) dev->launch_kernel(s, [] {});
  const auto t = thread_cpu_ns() - t0;
  dev->synchronize_stream(s);
  return static_cast<double>(t) / 1e3 / n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

int run(const overhead_args& a) {
  if (!(a.budget_ratio > 0 && a.budget_ratio <= 1))
    throw config_error("--budget-ratio: " + format_real(a.budget_ratio) + " is not a ratio above 0 and at most 1 (such as 0.25)");
  // Every policy is checked before the first is measured.
  for (const auto& p : a.policies) {
    try {
      config_for(a, p, 0).validate();
    } catch (const config_error&) {
      throw config_error("--policies: '" + p + "' is not a policy (none, lms, vdnn, auto, checkpoint, capuchin, zero-offload)");
    }
  }
  // A planned policy's budget (--budget-ratio of a footprint of 3 tensors a layer) must hold the
  // 3 tensors of one op, each placed at the device's granule: with fewer layers the first
  // iteration stops partway ("raise the device budget"). The least layers that do, up front.
  const std::uint64_t tensor = parse_size(a.tensor_size, "--tensor-size");
  if (tensor == 0) throw config_error("--tensor-size: give at least 1 byte, such as 64KiB");
  bool planned = false;
  for (const auto& p : a.policies) planned = planned || p != "none";
  const auto holds_one_op = [&](std::uint64_t layers) {
    return static_cast<double>(3 * layers * tensor) * a.budget_ratio >= static_cast<double>(3 * device_budget::placed(tensor));
  };
  if (planned && !holds_one_op(static_cast<std::uint64_t>(a.layers))) {
    std::uint64_t least = static_cast<std::uint64_t>(a.layers);
    while (least <= max_overhead_layers && !holds_one_op(least)) ++least;
    throw config_error("--layers: " + std::to_string(a.layers) + " is too few for a planned policy at --budget-ratio " +
                       format_real(a.budget_ratio) + " (its budget must hold one op's 3 tensors of " + a.tensor_size + "); " +
                       (least <= max_overhead_layers ? "give at least " + std::to_string(least) + ", or a larger --budget-ratio"
                                                     : std::string("give a larger --budget-ratio")));
  }
  check_outputs({{"--json", a.json}}, {{"--config", a.config.config_file}});
  const std::uint64_t footprint = footprint_of(a);
  const std::uint64_t planned_budget = static_cast<std::uint64_t>(static_cast<double>(footprint) * a.budget_ratio);
  std::cout << "overhead: " << a.layers * 3 << " zero-duration ops per iteration over " << a.layers * 3
            << " tensors of " << a.tensor_size << ", " << a.ops << " ops per run, median of " << a.runs
            << " runs, backend " << a.base.backend << "\n"
            << "footprint " << format_bytes(footprint) << "; planned policies at " << a.budget_ratio << " of it ("
            << format_bytes(planned_budget) << ")\n\n";
  std::vector<double> launches;
  for (int r = 0; r < a.runs; ++r) launches.push_back(empty_launch_us(a));
  const double launch_us = median(launches);

  nlohmann::json rows = nlohmann::json::array();
  bool met = true;
  std::cout << std::fixed << std::setprecision(2);
  std::cout << "policy  budget      host_us/op  total_us/op  calls/op  launch_us/op  instructions/op  target\n";
  for (const auto& policy : a.policies) {
    const std::uint64_t budget = policy == "none" ? 0 : planned_budget;
    std::vector<double> host, total, calls, instructions;
    for (int r = 0; r < a.runs; ++r) {
      const auto f = measure(a, policy, budget);
      host.push_back(f.host_us_per_op);
      total.push_back(f.total_us_per_op);
      calls.push_back(f.device_calls_per_op);
      if (f.instructions_per_op) instructions.push_back(*f.instructions_per_op);
    }
    const double host_us = median(host);
    const double target = policy == "none" ? a.target_none_us : a.target_planned_us;
    const bool ok = host_us <= target;
    met = met && ok;
    std::cout << std::left << std::setw(8) << policy << std::setw(12) << (budget == 0 ? "all" : format_bytes(budget))
              << std::right << std::setw(10) << host_us << std::setw(13) << median(total) << std::setw(10)
              << median(calls) << std::setw(14) << launch_us;
    if (!instructions.empty()) std::cout << std::setw(17) << std::setprecision(0) << median(instructions) << std::setprecision(2);
    else std::cout << std::setw(17) << "n/a";
    std::cout << "  " << (ok ? "PASS" : "MISS") << " (<= " << target << " us)\n";
    nlohmann::json row = {{"policy", policy},
                          {"ops", a.ops},
                          {"budget_bytes", budget},
                          {"host_us_per_op", host_us},
                          {"total_us_per_op", median(total)},
                          {"device_calls_per_op", median(calls)},
                          {"launch_us_per_op", launch_us},
                          {"target_us", target},
                          {"met", ok}};
    if (!instructions.empty()) row["instructions_per_op"] = median(instructions);
    rows.push_back(row);
  }
  if (!a.json.empty()) {
    nlohmann::json j = {{"benchmark", "overhead"}, {"backend", a.base.backend}, {"footprint_bytes", footprint}, {"rows", rows}};
    write_output(a.json, j.dump(2) + "\n", "--json");
  }
  return met ? 0 : 1;
}

const command_registration registration{"overhead", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<overhead_args>();
  auto* cmd = app.add_subcommand("overhead", "host CPU time per op of the Session and executor, beyond Device calls");
  examples::add_config_flags(*cmd, args->config,
                             {"backend", "cpu_device_memory", "cpu_callback_seed", "link_gbps", "host_budget", "nvme.directories",
                              "nvme.reserve", "lms_swapout_threshold", "lms_swapin_ahead", "lms_swapin_groupby", "vdnn_variant"});
  cmd->add_option("--layers", args->layers, "layers of the zero-work model (3 ops each)")
      ->capture_default_str()
      ->check(whole_number_in(2, max_overhead_layers));
  cmd->add_option("--tensor-size", args->tensor_size, "bytes of each tensor")->capture_default_str();
  cmd->add_option("--ops", args->ops, "measured ops per run")->capture_default_str()->check(whole_number_in(1, 100000000));
  cmd->add_option("--runs", args->runs, "runs; the median is reported")->capture_default_str()->check(whole_number_in(1, 1000));
  cmd->add_option("--policies", args->policies, "policies to measure")->capture_default_str();
  cmd->add_option("--budget-ratio", args->budget_ratio, "device budget of planned policies, of the footprint")
      ->capture_default_str();
  cmd->add_option("--target-none-us", args->target_none_us, "target host us per op with policy none")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--target-planned-us", args->target_planned_us, "target host us per op with planned policies")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--json", args->json, "write the figures as JSON")->check(writable_file);
  cmd->callback([args, &exit_code] {
    args->base = load_base(args->config);
    exit_code = run(*args);
  });
}};

}  // namespace
}  // namespace spillway::bench
