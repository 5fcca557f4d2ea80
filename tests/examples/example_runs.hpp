// What the example tests share: an example run or made by its name, the tiny options they
// train with on the cpu backend, and a run's losses as text (for messages and exact comparisons).
#pragma once

#include <cstdint>
#include <string>

#include "device/units.hpp"
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/report.hpp"
#include "examples/gpt/gpt_model.hpp"
#include "examples/mlp/mlp_model.hpp"

namespace spillway::examples::testing {

/// Steps of a tiny run.
inline constexpr int tiny_steps = 3;

/// Trains the example named `example` ("gpt", "mlp" or "cnn") with `o`.
inline run_result run_example(const std::string& example, const example_options& o) {
  if (example == "gpt") return run_gpt(o);
  return example == "mlp" ? run_mlp(o) : run_cnn(o);
}

/// Makes the example named `example` with `o`, for a training_run.
inline model_factory factory_for(const std::string& example, const example_options& o) {
  if (example == "gpt") return [o] { return make_gpt(o); };
  if (example == "mlp") return [o] { return make_mlp(o); };
  return [o] { return make_cnn(o); };
}

/// The tiny preset on the cpu backend (64 MiB of device memory), seed 7, tiny_steps steps, with
/// this policy and device budget (0: the whole device).
inline example_options tiny_options(const std::string& policy, std::uint64_t budget) {
  using literals::operator""_MiB;
  example_options o;
  o.backend = "cpu";
  o.cpu_device_memory = 64_MiB;
  o.device_budget = budget;
  o.policy = policy;
  o.steps = tiny_steps;
  o.seed = 7;
  o.size = preset::tiny;
  return o;
}

/// The losses, each as format_loss writes it, separated by spaces.
inline std::string losses_text(const run_result& r) {
  std::string s;
  for (float l : r.losses) s += format_loss(l) + " ";
  return s;
}

}  // namespace spillway::examples::testing
