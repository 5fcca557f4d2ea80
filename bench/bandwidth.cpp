// spillway-bench bandwidth: pinned host <-> device copy bandwidth on one backend.
// The GPU check runs it on the cuda backend; on the cpu backend it measures the emulated link.
#include <chrono>
#include <cstring>
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "examples/common/flags.hpp"
#include "device/device.hpp"
#include "device/units.hpp"

namespace spillway::bench {
namespace {

struct bandwidth_args {
  examples::config_flags config;  // --config, --backend, --cpu-device-memory, --link-gbps, ...
  std::string size = "256MiB";
  int repeats = 5;
  std::string json;
};

double measure(Device& dev, stream s, void* dst, const void* src, std::size_t n, copy_kind kind, int repeats) {
  dev.copy_async(dst, src, n, kind, s);  // warm up
  dev.synchronize_stream(s);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) dev.copy_async(dst, src, n, kind, s);
  dev.synchronize_stream(s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(n) * repeats / seconds / 1e9;
}

int run(const bandwidth_args& a) {
  check_outputs({{"--json", a.json}}, {{"--config", a.config.config_file}});
  const std::size_t n = parse_size(a.size, "--size");
  session_config c = examples::load_config(a.config);
  c.validate();
  device_options o;
  o.cpu_device_memory = c.cpu_device_memory != 0 ? c.cpu_device_memory : n + (std::size_t{64} << 20);
  o.strict.callback_seed = c.cpu_callback_seed;
  o.h2d_bytes_per_second = o.d2h_bytes_per_second = c.link_gbps * 1e9;
  auto dev = make_device(c.backend, o);
  owned_stream s(*dev);
  void* host = dev->allocate_pinned(n);
  std::memset(host, 1, n);
  void* d = dev->allocate(n);
  const double h2d = measure(*dev, s, d, host, n, copy_kind::host_to_device, a.repeats);
  const double d2h = measure(*dev, s, host, d, n, copy_kind::device_to_host, a.repeats);
  dev->deallocate(d, n);
  dev->deallocate_pinned(host, n);

  std::cout << "device: " << dev->properties().name << " (" << to_string(dev->properties().backend) << ")\n"
            << "pinned copies of " << format_bytes(n) << ", " << a.repeats << " repeats\n"
            << "  host-to-device " << h2d << " GB/s\n"
            << "  device-to-host " << d2h << " GB/s\n";
  if (!a.json.empty()) {
    nlohmann::json j = {{"device", dev->properties().name},
                        {"backend", to_string(dev->properties().backend)},
                        {"bytes", n},
                        {"h2d_gbps", h2d},
                        {"d2h_gbps", d2h}};
    write_output(a.json, j.dump(2) + "\n", "--json");
  }
  return 0;
}

const command_registration registration{"bandwidth", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<bandwidth_args>();
  auto* cmd = app.add_subcommand("bandwidth", "pinned host <-> device copy bandwidth");
  examples::add_config_flags(*cmd, args->config, {"backend", "cpu_device_memory", "cpu_callback_seed", "link_gbps"});
  cmd->add_option("--size", args->size, "bytes per copy (e.g. 256MiB)")->capture_default_str();
  cmd->add_option("--repeats", args->repeats, "copies per direction")->capture_default_str()->check(whole_number_in(1, 1000));
  cmd->add_option("--json", args->json, "write the figures as JSON")->check(writable_file);
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}};

}  // namespace
}  // namespace spillway::bench
