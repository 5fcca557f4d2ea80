// Built-in hardware profiles and their JSON form. Where each number comes from is in
// offload/PROFILES.md; keep the two in step.
#include "offload/profile.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/text_file.hpp"

namespace spillway::offload {

namespace {
constexpr double GB = 1e9;
constexpr double TF = 1e12;

// The host that runs host ops: sockets x channels x MT/s x 8 bytes of DRAM, used at `dram_use`
// (STREAM-like), cores, fp32 flops per core per cycle, all-core clock.
struct host_cpu {
  double dram_gbps, dram_use;
  int cores, flops_per_cycle;
  double ghz;
};

hw_profile make(std::string name, double dev_gb, double peak_tf, double sustained, double hbm_gbps,
                double link_gbps, double host_gb, double nvme_r, double nvme_w, double nvme_gb, host_cpu cpu) {
  hw_profile p;
  p.name = std::move(name);
  p.device_bytes = static_cast<std::uint64_t>(dev_gb * GB);
  p.compute_flops_per_s = peak_tf * TF * sustained;
  p.hbm_bytes_per_s = hbm_gbps * GB * 0.8;
  p.h2d_bytes_per_s = link_gbps * GB;
  p.d2h_bytes_per_s = link_gbps * GB;
  p.copy_engines = 2;
  p.host_bytes = static_cast<std::uint64_t>(host_gb * GB);
  p.nvme_read_bytes_per_s = nvme_r * GB;
  p.nvme_write_bytes_per_s = nvme_w * GB;
  p.nvme_bytes = static_cast<std::uint64_t>(nvme_gb * GB);
  p.host_mem_bytes_per_s = cpu.dram_gbps * GB * cpu.dram_use;
  p.host_cores = cpu.cores;
  p.host_vector_width = cpu.flops_per_cycle;
  p.host_clock_hz = cpu.ghz * 1e9;
  return p;
}

// The network between ranks: the NIC each GPU has to itself, in Gb/s as NICs are sold, and the
// latency of one ring step (PROFILES.md).
hw_profile with_network(hw_profile p, double gbit_per_s, double latency_us) {
  p.network_bytes_per_s = gbit_per_s * GB / 8;
  p.network_latency_s = latency_us * 1e-6;
  return p;
}

std::vector<hw_profile> builtins() {
  // name, device GB, peak TFLOP/s, sustained fraction, HBM GB/s, effective PCIe GB/s per
  // direction, host tier GB, NVMe read/write GB/s, NVMe GB, host CPU. See PROFILES.md.
  // Host CPUs: DRAM GB/s = sockets x channels x MT/s x 8 B; fp32 flops/cycle = lanes x FMA units x 2.
  constexpr host_cpu xeon_8480c{2 * 8 * 4.8 * 8, 0.75, 112, 64, 2.0};  // DGX H200: 2x 56 cores, AVX-512, DDR5-4800
  constexpr host_cpu epyc_7742{2 * 8 * 3.2 * 8, 0.75, 128, 32, 2.25};  // DGX A100: 2x 64 cores, AVX2, DDR4-3200
  constexpr host_cpu xeon_8168{2 * 6 * 2.666 * 8, 0.75, 48, 64, 2.7};  // DGX-2: 2x 24 cores, AVX-512, DDR4-2666
  constexpr host_cpu xeon_6148{2 * 6 * 2.666 * 8, 0.75, 40, 64, 2.4};  // 2x 20 cores, AVX-512, DDR4-2666
  constexpr host_cpu i7_5930k{1 * 4 * 2.133 * 8, 0.75, 6, 32, 3.5};    // 6 cores, AVX2, DDR4-2133
  return {
      with_network(make("h200", 141, 989, 0.6, 4800, 50, 1000, 13.8, 8.2, 7680, xeon_8480c), 400, 10),
      with_network(make("a100-80g", 80, 312, 0.6, 2039, 25, 512, 13.8, 8.2, 7680, epyc_7742), 200, 10),
      with_network(make("v100-32g", 32, 125, 0.5, 900, 12, 1000, 3.2, 2.08, 3200, xeon_8168), 50, 10),
      with_network(make("v100-16g", 16, 112, 0.5, 900, 12, 256, 3.2, 2.08, 3200, xeon_6148), 100, 10),
      with_network(make("titanx-12g", 12, 6.1, 0.7, 336.5, 12, 64, 3.2, 2.08, 3200, i7_5930k), 10, 30),
  };
}

double need_number(const nlohmann::json& j, const char* field) {
  if (!j.contains(field) || !j[field].is_number())
    throw config_error(std::string("hardware profile: field '") + field + "' (number) is missing");
  const double v = j[field].get<double>();
  if (!(v > 0) || !std::isfinite(v))
    throw config_error(std::string("hardware profile: field '") + field + "' must be positive, got " + j[field].dump());
  return v;
}

std::uint64_t need_size(const nlohmann::json& j, const char* field) {
  if (!j.contains(field)) throw config_error(std::string("hardware profile: field '") + field + "' is missing");
  const auto& v = j[field];
  if (v.is_number_unsigned()) {
    if (v.get<std::uint64_t>() > max_size_bytes)
      throw config_error(std::string("hardware profile: field '") + field + "' is " + v.dump() +
                         " bytes, above the largest size Spillway accepts (" + format_bytes(max_size_bytes) + ")");
    return v.get<std::uint64_t>();
  }
  if (v.is_string()) return parse_size(v.get<std::string>(), std::string("hardware profile field ") + field);
  throw config_error(std::string("hardware profile: field '") + field + "' must be a size (a byte count or a string such as \"80GiB\"), got " +
                     v.dump());
}
}  // namespace

double hw_profile::op_seconds(const op_desc& op) const noexcept {
  if (op.measured_seconds) return *op.measured_seconds;
  return std::max(op.flops / compute_flops_per_s, static_cast<double>(op.bytes) / hbm_bytes_per_s);
}

double hw_profile::host_op_seconds(const op_desc& op) const noexcept {
  if (!runs_host_ops()) return std::numeric_limits<double>::infinity();
  const double flops_per_s = static_cast<double>(host_cores) * host_vector_width * host_clock_hz;
  return std::max(static_cast<double>(op.host_bytes) / host_mem_bytes_per_s, op.host_flops / flops_per_s);
}

void hw_profile::validate() const {
  auto check = [&](bool ok, const char* field) {
    if (!ok) throw config_error("hardware profile '" + name + "': field '" + field + "' must be positive and finite");
  };
  const auto rate = [](double v) { return v > 0 && std::isfinite(v); };  // a number of GB/s past 1e299 is not
  check(device_bytes > 0, "device_memory");
  check(rate(compute_flops_per_s), "compute_tflops");
  check(rate(hbm_bytes_per_s), "hbm_gbps");
  check(rate(h2d_bytes_per_s), "h2d_gbps");
  check(rate(d2h_bytes_per_s), "d2h_gbps");
  check(copy_engines > 0, "copy_engines");
  check(rate(nvme_read_bytes_per_s), "nvme_read_gbps");
  check(rate(nvme_write_bytes_per_s), "nvme_write_gbps");
  if (host_mem_bytes_per_s != 0 || host_cores != 0 || host_vector_width != 0 || host_clock_hz != 0) {
    check(rate(host_mem_bytes_per_s), "host_memory_gbps");
    check(host_cores > 0, "host_cores");
    check(host_vector_width > 0, "host_vector_width");
    check(rate(host_clock_hz), "host_ghz");
  }
  if (network_bytes_per_s != 0 || network_latency_s != 0) {
    if (!(network_bytes_per_s > 0))  // infinity is an unlimited network
      throw config_error("hardware profile '" + name + "': field 'network_gbps' must be positive");
    if (!(network_latency_s >= 0) || !std::isfinite(network_latency_s))
      throw config_error("hardware profile '" + name + "': field 'network_latency_us' must be zero or more and finite");
  }
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> names;
  for (const auto& p : builtins()) names.push_back(p.name);
  return names;
}

hw_profile get_profile(std::string_view name_or_path) {
  for (auto& p : builtins())
    if (p.name == name_or_path) return p;
  if (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json") {
    const std::string path(name_or_path);
    const std::string text = read_text_file(path, "the hardware profile", "a hardware profile JSON file (offload/PROFILES.md)");
    try {
      return profile_from_json(nlohmann::json::parse(text));
    } catch (const nlohmann::json::exception& e) {
      throw config_error(path + ": hardware profile: " + e.what());
    } catch (const config_error& e) {
      throw config_error(path + ": " + e.what());  // a field of the file: say which file
    }
  }
  std::string list;
  for (const auto& n : builtin_profile_names()) list += (list.empty() ? "" : ", ") + n;
  throw config_error("unknown hardware profile '" + std::string(name_or_path) + "' (built-in: " + list +
                     "; or a .json file)");
}

hw_profile profile_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw config_error("hardware profile: must be a JSON object");
  hw_profile p;
  if (j.contains("name") && !j["name"].is_string())
    throw config_error("hardware profile: field 'name' must be a string, got " + j["name"].dump());
  p.name = j.value("name", std::string("custom"));
  p.device_bytes = need_size(j, "device_memory");
  p.compute_flops_per_s = need_number(j, "compute_tflops") * TF;
  p.hbm_bytes_per_s = need_number(j, "hbm_gbps") * GB;
  p.h2d_bytes_per_s = need_number(j, "h2d_gbps") * GB;
  p.d2h_bytes_per_s = need_number(j, "d2h_gbps") * GB;
  const double engines = need_number(j, "copy_engines");
  if (engines != std::floor(engines) || engines > 64)
    throw config_error("hardware profile: field 'copy_engines' must be a whole number from 1 to 64, got " +
                       j["copy_engines"].dump());
  p.copy_engines = static_cast<int>(engines);
  p.host_bytes = need_size(j, "host_memory");
  p.nvme_read_bytes_per_s = need_number(j, "nvme_read_gbps") * GB;
  p.nvme_write_bytes_per_s = need_number(j, "nvme_write_gbps") * GB;
  p.nvme_bytes = need_size(j, "nvme_capacity");
  const char* host_fields[] = {"host_memory_gbps", "host_cores", "host_vector_width", "host_ghz"};
  int given = 0;
  for (const char* f : host_fields) given += j.contains(f) ? 1 : 0;
  if (given != 0 && given != 4)
    throw config_error("hardware profile: give all of 'host_memory_gbps', 'host_cores', 'host_vector_width' and "
                       "'host_ghz' (the host that runs host ops) or none of them");
  if (given == 4) {
    p.host_mem_bytes_per_s = need_number(j, "host_memory_gbps") * GB;
    auto whole = [&](const char* f) {
      const double v = need_number(j, f);
      if (v != std::floor(v) || v > 1e6)
        throw config_error(std::string("hardware profile: field '") + f + "' must be a whole number from 1 to 1000000, got " +
                           j[f].dump());
      return static_cast<int>(v);
    };
    p.host_cores = whole("host_cores");
    p.host_vector_width = whole("host_vector_width");
    p.host_clock_hz = need_number(j, "host_ghz") * 1e9;
  }
  if (j.contains("network_gbps") != j.contains("network_latency_us"))
    throw config_error("hardware profile: give both 'network_gbps' and 'network_latency_us' (the network between ranks) or "
                       "neither");
  if (j.contains("network_gbps")) {
    p.network_bytes_per_s = need_number(j, "network_gbps") * GB;
    const auto& lat = j["network_latency_us"];
    if (!lat.is_number() || !(lat.get<double>() >= 0) || !std::isfinite(lat.get<double>()))
      throw config_error("hardware profile: field 'network_latency_us' must be a number of microseconds, zero or more, got " +
                         lat.dump());
    p.network_latency_s = lat.get<double>() * 1e-6;
  }
  p.validate();
  return p;
}

nlohmann::json profile_to_json(const hw_profile& p) {
  nlohmann::json j = {{"name", p.name},
          {"device_memory", p.device_bytes},
          {"compute_tflops", p.compute_flops_per_s / TF},
          {"hbm_gbps", p.hbm_bytes_per_s / GB},
          {"h2d_gbps", p.h2d_bytes_per_s / GB},
          {"d2h_gbps", p.d2h_bytes_per_s / GB},
          {"copy_engines", p.copy_engines},
          {"host_memory", p.host_bytes},
          {"nvme_read_gbps", p.nvme_read_bytes_per_s / GB},
          {"nvme_write_gbps", p.nvme_write_bytes_per_s / GB},
          {"nvme_capacity", p.nvme_bytes}};
  if (p.runs_host_ops()) {
    j["host_memory_gbps"] = p.host_mem_bytes_per_s / GB;
    j["host_cores"] = p.host_cores;
    j["host_vector_width"] = p.host_vector_width;
    j["host_ghz"] = p.host_clock_hz / 1e9;
  }
  if (p.has_network() && std::isfinite(p.network_bytes_per_s)) {
    j["network_gbps"] = p.network_bytes_per_s / GB;
    j["network_latency_us"] = p.network_latency_s * 1e6;
  }
  return j;
}

}  // namespace spillway::offload
