// The examples' shared flags and their parsing into example_options (sizes through
// spillway::parse_size, names checked by example_options::validate).
#include "examples/common/flags.hpp"

#include "device/units.hpp"

namespace spillway::examples {

void add_common_flags(CLI::App& app, flag_values& v, bool with_data) {
  app.add_option("--backend", v.backend, "auto (cuda when a GPU answers), cpu or cuda")->capture_default_str();
  app.add_option("--device-memory", v.device_memory, "cpu backend: emulated device memory, e.g. 1GiB (default 1 GiB)");
  app.add_option("--device-budget", v.device_budget, "device memory Spillway may use, e.g. 256MiB (default: what is free)");
  app.add_option("--budget-ratio", v.budget_ratio,
                 "device budget as a fraction of the model's footprint (learned by a first one-step run)");
  app.add_option("--host-budget", v.host_budget, "pinned host tier capacity, e.g. 512MiB (default: no limit)");
  app.add_option("--nvme-dir", v.nvme_dirs, "NVMe-tier swap directory (repeat to stripe over several)");
  app.add_option("--policy", v.policy, "swap policy: none, lms, vdnn or auto")->capture_default_str();
  app.add_option("--link-gbps", v.link_gbps, "cpu backend: host<->device link GB/s each way (0 = unlimited)")
      ->capture_default_str();
  app.add_option("--steps", v.steps, "training steps")->capture_default_str();
  app.add_option("--seed", v.seed, "seed of initial weights and data")->capture_default_str();
  app.add_option("--preset", v.preset, "model size: tiny, small (about 1 s/step on 2 cpu cores), medium, large (GPU)")
      ->capture_default_str();
  app.add_option("--chrome-trace", v.chrome_trace, "write a Chrome trace of the run here");
  app.add_option("--report", v.report, "write a JSON report of the run here");
  if (with_data) app.add_option("--data", v.data, "text file to train on (bytes are the tokens)")->capture_default_str();
}

example_options to_options(const flag_values& v) {
  example_options o;
  o.backend = v.backend;
  if (!v.device_memory.empty()) o.device_memory = parse_size(v.device_memory, "--device-memory");
  if (!v.device_budget.empty()) o.device_budget = parse_size(v.device_budget, "--device-budget");
  o.budget_ratio = v.budget_ratio;
  if (!v.host_budget.empty()) o.host_budget = parse_size(v.host_budget, "--host-budget");
  o.nvme_dirs = v.nvme_dirs;
  o.policy = v.policy;
  o.link_gbps = v.link_gbps;
  o.steps = v.steps;
  o.seed = v.seed;
  o.size = parse_preset(v.preset);
  o.chrome_trace = v.chrome_trace;
  o.data = v.data;
  o.validate();
  return o;
}

}  // namespace spillway::examples
