// Filling a session_config from the environment or JSON, and checking it before any work starts.
// Every error names the variable or key and quotes the value given.
#include "offload/session_config.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::uint64_t parse_count(std::string_view text, std::string_view what) {
  std::uint64_t v = 0;
  std::size_t used = 0;
  try {
    if (!text.empty() && text.front() != '-') v = std::stoull(std::string(text), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw config_error(std::string(what) + ": \"" + std::string(text) + "\" is not a whole number >= 0");
  return v;
}

double parse_real(std::string_view text, std::string_view what) {
  double v = 0;
  std::size_t used = 0;
  try {
    v = std::stod(std::string(text), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(v >= 0))
    throw config_error(std::string(what) + ": \"" + std::string(text) + "\" is not a number >= 0");
  return v;
}

std::vector<std::string> split_paths(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace

void session_config::apply_env() {
  if (auto v = env("SPILLWAY_DEVICE")) device = v;
  if (auto v = env("SPILLWAY_CPU_DEVICE_MEMORY")) cpu_device_memory = parse_size(v, "SPILLWAY_CPU_DEVICE_MEMORY");
  if (auto v = env("SPILLWAY_LINK_GBPS")) link_gbps = parse_real(v, "SPILLWAY_LINK_GBPS");
  if (auto v = env("SPILLWAY_DEVICE_BUDGET")) device_budget = parse_size(v, "SPILLWAY_DEVICE_BUDGET");
  if (auto v = env("SPILLWAY_HOST_BUDGET")) host_budget = parse_size(v, "SPILLWAY_HOST_BUDGET");
  if (auto v = env("SPILLWAY_NVME_PATHS")) nvme_paths = split_paths(v);
  if (auto v = env("SPILLWAY_NVME_RESERVE")) nvme_reserve = parse_size(v, "SPILLWAY_NVME_RESERVE");
  if (auto v = env("SPILLWAY_POLICY")) policy = v;
  if (auto v = env("SPILLWAY_LMS_SWAPOUT_THRESHOLD")) lms_swapout_threshold = parse_count(v, "SPILLWAY_LMS_SWAPOUT_THRESHOLD");
  if (auto v = env("SPILLWAY_LMS_SWAPIN_AHEAD")) lms_swapin_ahead = parse_count(v, "SPILLWAY_LMS_SWAPIN_AHEAD");
  if (auto v = env("SPILLWAY_LMS_SWAPIN_GROUPBY")) lms_swapin_groupby = parse_count(v, "SPILLWAY_LMS_SWAPIN_GROUPBY");
  if (auto v = env("SPILLWAY_VDNN_VARIANT")) vdnn_variant = v;
  if (auto v = env("SPILLWAY_CHROME_TRACE")) chrome_trace = v;
}

session_config session_config::from_env() {
  session_config c;
  c.apply_env();
  return c;
}

session_config session_config::from_json_text(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw config_error(std::string("session config: not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw config_error("session config: expected a JSON object of settings");
  session_config c;
  auto text_of = [](const nlohmann::json& v, const std::string& key) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_unsigned() || v.is_number_integer()) return v.dump();
    throw config_error("session config: \"" + key + "\" must be a string or a number, not " + v.dump());
  };
  for (const auto& [key, v] : j.items()) {
    const std::string what = "session config \"" + key + "\"";
    if (key == "device") c.device = text_of(v, key);
    else if (key == "cpu_device_memory") c.cpu_device_memory = parse_size(text_of(v, key), what);
    else if (key == "link_gbps") c.link_gbps = v.is_number() ? v.get<double>() : parse_real(text_of(v, key), what);
    else if (key == "device_budget") c.device_budget = parse_size(text_of(v, key), what);
    else if (key == "host_budget") c.host_budget = parse_size(text_of(v, key), what);
    else if (key == "nvme_reserve") c.nvme_reserve = parse_size(text_of(v, key), what);
    else if (key == "nvme_paths") {
      if (!v.is_array()) throw config_error(what + " must be an array of directory paths, not " + v.dump());
      c.nvme_paths.clear();
      for (const auto& p : v) {
        if (!p.is_string()) throw config_error(what + " must hold strings, not " + p.dump());
        c.nvme_paths.push_back(p.get<std::string>());
      }
    } else if (key == "policy") c.policy = text_of(v, key);
    else if (key == "lms_swapout_threshold") c.lms_swapout_threshold = parse_count(text_of(v, key), what);
    else if (key == "lms_swapin_ahead") c.lms_swapin_ahead = parse_count(text_of(v, key), what);
    else if (key == "lms_swapin_groupby") c.lms_swapin_groupby = parse_count(text_of(v, key), what);
    else if (key == "vdnn_variant") c.vdnn_variant = text_of(v, key);
    else if (key == "chrome_trace") c.chrome_trace = text_of(v, key);
    else throw config_error("session config: unknown setting \"" + key +
                            "\" (known: device, cpu_device_memory, link_gbps, device_budget, host_budget, "
                            "nvme_paths, nvme_reserve, policy, lms_swapout_threshold, lms_swapin_ahead, "
                            "lms_swapin_groupby, vdnn_variant, chrome_trace)");
  }
  return c;
}

session_config session_config::from_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw config_error("session config: cannot read \"" + path + "\"");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str());
}

void session_config::validate() const {
  if (device != "auto" && device != "cpu" && device != "cuda")
    throw config_error("device \"" + device + "\" is not one of auto, cpu, cuda");
  if (policy != "none" && policy != "lms" && policy != "vdnn" && policy != "auto")
    throw config_error("policy \"" + policy + "\" is not one of none, lms, vdnn, auto");
  if (vdnn_variant != "all" && vdnn_variant != "conv")
    throw config_error("vdnn_variant \"" + vdnn_variant + "\" is not one of all, conv");
  if (device_budget > max_size_bytes || host_budget > max_size_bytes)
    throw config_error("a budget past 1 PiB was given; write it as 6GiB, 512MiB, ...");
}

}  // namespace spillway
