// spillway-bench kit: facts the GPU run kit (bench/gpu_check) reports beside its figures: what
// the CUDA runtime, driver and libraries say, and the shape of a GPT preset (for its peers).
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "device/error.hpp"
#include "examples/common/options.hpp"
#include "examples/gpt/gpt_model.hpp"
#if SPILLWAY_HAVE_CUDA
#include "bench/plain_cuda.hpp"
#endif

namespace spillway::bench {
namespace {

void write_json(const nlohmann::json& j, const std::string& path) {
  if (path.empty()) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  write_output(path, j.dump(2) + "\n", "--json");
}

// The CUDA build's cuda_info uses it.
[[maybe_unused]] std::string version_text(long v, long major_div, long minor_div, long minor_mod) {
  if (v < 0) return "unknown";
  return std::to_string(v / major_div) + "." + std::to_string(v / minor_div % minor_mod);
}

int cuda_info(const std::string& json) {
  nlohmann::json j;
#if SPILLWAY_HAVE_CUDA
  const auto f = plain::query_cuda();
  j = {{"cuda_backend_built", true},
       {"driver_version", f.driver_version},
       {"driver_cuda", version_text(f.driver_version, 1000, 10, 100)},
       {"runtime_version", f.runtime_version},
       {"runtime", version_text(f.runtime_version, 1000, 10, 100)},
       {"device_count", f.device_count},
       {"device_count_error", f.device_count_error},
       {"name", f.name},
       {"total_memory_bytes", f.total_memory},
       {"free_memory_bytes", f.free_memory},
       {"compute_capability", std::to_string(f.cc_major) + "." + std::to_string(f.cc_minor)},
       {"cublas_version", f.cublas_version},
       {"cublas", version_text(f.cublas_version, 10000, 100, 100)},
       {"cudnn_version", f.cudnn_version},
       {"cudnn", version_text(f.cudnn_version, 10000, 100, 100)}};
  std::cerr << "cuda: driver " << (f.driver_version > 0 ? "supports CUDA " + j["driver_cuda"].get<std::string>() : "not found")
            << ", runtime "
            << j["runtime"].get<std::string>() << ", cuBLAS " << j["cublas"].get<std::string>() << ", cuDNN "
            << j["cudnn"].get<std::string>() << "; " << f.device_count << " device(s)";
  if (!f.device_count_error.empty()) std::cerr << " (" << f.device_count_error << ")";
  if (!f.name.empty()) std::cerr << "; device 0: " << f.name;
  std::cerr << "\n";
#else
  j = {{"cuda_backend_built", false}, {"device_count", 0}, {"device_count_error", "this build has no cuda backend"}};
  std::cerr << "cuda: this build has no cuda backend\n";
#endif
  write_json(j, json);
  return 0;
}

int gpt_shape(const std::string& preset, const std::string& json) {
  const auto s = examples::gpt_preset(examples::parse_preset(preset));
  write_json({{"preset", preset}, {"vocab", s.vocab}, {"seq", s.seq}, {"channels", s.channels}, {"heads", s.heads},
              {"layers", s.layers}, {"batch", s.batch}},
             json);
  return 0;
}

const command_registration cuda_registration{"cuda-info", [](CLI::App& app, int& exit_code) {
  auto json = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("cuda-info", "CUDA driver, runtime, cuBLAS and cuDNN versions, devices (JSON)");
  cmd->add_option("--json", *json, "write it here instead of stdout")->check(writable_file);
  cmd->callback([json, &exit_code] { exit_code = cuda_info(*json); });
}};

const command_registration shape_registration{"gpt-shape", [](CLI::App& app, int& exit_code) {
  auto preset = std::make_shared<std::string>("medium");
  auto json = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("gpt-shape", "the GPT example's shape at a preset (JSON), for models built elsewhere");
  cmd->add_option("--preset", *preset, "tiny, small, medium or large")->capture_default_str();
  cmd->add_option("--json", *json, "write it here instead of stdout")->check(writable_file);
  cmd->callback([preset, json, &exit_code] { exit_code = gpt_shape(*preset, *json); });
}};

}  // namespace
}  // namespace spillway::bench
