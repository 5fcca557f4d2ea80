// spillway-bench copies: the backend's pinned host <-> device copies against a plain loop in the
// same run (cuda: cudaMemcpyAsync on cudaMallocHost/cudaMalloc buffers; cpu: memcpy).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "examples/common/flags.hpp"
#include "device/device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#if SPILLWAY_HAVE_CUDA
#include "bench/plain_cuda.hpp"
#endif

namespace spillway::bench {
namespace {

using clk = std::chrono::steady_clock;

struct copies_args {
  examples::config_flags config;  // --config, --backend, --cpu-device-memory, ...
  std::string size = "256MiB";
  int copies = 4;
  int repeats = 5;
  double target = 0.9;
  std::string json;
};

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// Spillway's side: copies through the Device on one of its streams, from its pinned memory.
double device_seconds(Device& dev, stream s, void* dst, const void* src, std::size_t n, copy_kind kind, int copies) {
  const auto t0 = clk::now();
  for (int i = 0; i < copies; ++i) dev.copy_async(dst, src, n, kind, s);
  dev.synchronize_stream(s);
  return seconds_since(t0);
}

struct plain_loop {
  virtual ~plain_loop() = default;
  virtual double h2d_seconds(int copies) = 0;
  virtual double d2h_seconds(int copies) = 0;
  virtual std::string what() const = 0;
};

// cpu backend: device memory is host memory, so the plain loop is memcpy between the same two
// buffers the backend copies between.
struct memcpy_loop final : plain_loop {
  void* host;
  void* device;
  std::size_t n;
  memcpy_loop(void* h, void* d, std::size_t bytes) : host(h), device(d), n(bytes) {}
  double h2d_seconds(int copies) override {
    const auto t0 = clk::now();
    for (int i = 0; i < copies; ++i) std::memcpy(device, host, n);
    return seconds_since(t0);
  }
  double d2h_seconds(int copies) override {
    const auto t0 = clk::now();
    for (int i = 0; i < copies; ++i) std::memcpy(host, device, n);
    return seconds_since(t0);
  }
  std::string what() const override { return "memcpy loop on the same buffers"; }
};

#if SPILLWAY_HAVE_CUDA
struct cuda_loop final : plain_loop {
  plain::cuda_copy_loop loop;
  explicit cuda_loop(std::size_t n) : loop(n) {}
  double h2d_seconds(int copies) override { return loop.h2d_seconds(copies); }
  double d2h_seconds(int copies) override { return loop.d2h_seconds(copies); }
  std::string what() const override { return "cudaMemcpyAsync loop, cudaMallocHost + cudaMalloc, one stream"; }
};
#endif

int run(const copies_args& a) {
  check_outputs({{"--json", a.json}}, {{"--config", a.config.config_file}});
  const std::size_t n = parse_size(a.size, "--size");
  session_config c = examples::load_config(a.config);
  c.validate();
  device_options o;
  o.cpu_device_memory = c.cpu_device_memory != 0 ? c.cpu_device_memory : n + (std::size_t{64} << 20);
  o.strict.callback_seed = c.cpu_callback_seed;
  auto dev = make_device(c.backend, o);
  const bool cpu = dev->properties().backend == backend::cpu;
  owned_stream s(*dev);
  void* host = dev->allocate_pinned(n);
  std::memset(host, 1, n);
  void* d = dev->allocate(n);
  dev->memset_async(d, 2, n, s);
  dev->synchronize_stream(s);

  std::unique_ptr<plain_loop> plain;
  if (cpu) plain = std::make_unique<memcpy_loop>(host, d, n);
#if SPILLWAY_HAVE_CUDA
  else plain = std::make_unique<cuda_loop>(n);
#endif
  if (plain == nullptr)
    throw config_error(c.source_of("backend") + ": copies has no plain loop for the " + c.backend + " backend");
  const std::string what = plain->what();

  // Turns: ours then the plain loop, each direction, every round; best of each. Round 0 warms
  // up (first touches, lazy mappings) and is not counted.
  double ours_h2d = 1e30, ours_d2h = 1e30, plain_h2d = 1e30, plain_d2h = 1e30;
  for (int r = 0; r <= a.repeats; ++r) {
    const double oh = device_seconds(*dev, s, d, host, n, copy_kind::host_to_device, a.copies);
    const double ph = plain->h2d_seconds(a.copies);
    const double od = device_seconds(*dev, s, host, d, n, copy_kind::device_to_host, a.copies);
    const double pd = plain->d2h_seconds(a.copies);
    if (r == 0) continue;
    ours_h2d = std::min(ours_h2d, oh);
    plain_h2d = std::min(plain_h2d, ph);
    ours_d2h = std::min(ours_d2h, od);
    plain_d2h = std::min(plain_d2h, pd);
  }
  plain.reset();

  // Both directions at once, on two streams, from a second pair of buffers: what each direction
  // keeps of its rate while the other runs (the planner assumes they overlap). Best of the turns.
  double both_h2d = 1e30, both_d2h = 1e30;
  {
    owned_stream s2(*dev);
    void* host2 = dev->allocate_pinned(n);
    void* d2 = dev->allocate(n);
    for (int r = 0; r <= a.repeats; ++r) {
      const auto t0 = clk::now();
      for (int i = 0; i < a.copies; ++i) {
        dev->copy_async(d, host, n, copy_kind::host_to_device, s);
        dev->copy_async(host2, d2, n, copy_kind::device_to_host, s2);
      }
      dev->synchronize_stream(s);
      const double h = seconds_since(t0);
      dev->synchronize_stream(s2);
      const double dd = seconds_since(t0);
      if (r == 0) continue;
      both_h2d = std::min(both_h2d, h);
      both_d2h = std::min(both_d2h, dd);
    }
    dev->deallocate(d2, n);
    dev->deallocate_pinned(host2, n);
  }
  dev->deallocate(d, n);
  dev->deallocate_pinned(host, n);

  const double bytes = static_cast<double>(n) * a.copies;
  const double gh = bytes / ours_h2d / 1e9, gd = bytes / ours_d2h / 1e9;
  const double ph = bytes / plain_h2d / 1e9, pd = bytes / plain_d2h / 1e9;
  std::cout << std::fixed << std::setprecision(2) << "device: " << dev->properties().name << " ("
            << to_string(dev->properties().backend) << ")\n"
            << a.copies << " copies of " << format_bytes(n) << " per turn, best of " << a.repeats << "\n"
            << "plain loop: " << what << "\n"
            << "  host-to-device  spillway " << gh << " GB/s, plain " << ph << " GB/s (" << gh / ph << "x)\n"
            << "  device-to-host  spillway " << gd << " GB/s, plain " << pd << " GB/s (" << gd / pd << "x)\n";
  const double bh = bytes / both_h2d / 1e9, bd = bytes / both_d2h / 1e9;
  std::cout << "  both at once    host-to-device " << bh << " GB/s, device-to-host " << bd
            << " GB/s (two streams; informational)\n";
  const bool met = gh >= a.target * ph && gd >= a.target * pd;
  std::cout << "target: both directions at least " << a.target << "x the plain loop: " << (met ? "PASS" : "MISS") << "\n";
  if (!a.json.empty()) {
    nlohmann::json j = {{"device", dev->properties().name},
                        {"backend", to_string(dev->properties().backend)},
                        {"bytes", n},
                        {"copies", a.copies},
                        {"repeats", a.repeats},
                        {"plain", what},
                        {"h2d_gbps", gh},
                        {"d2h_gbps", gd},
                        {"plain_h2d_gbps", ph},
                        {"plain_d2h_gbps", pd},
                        {"both_h2d_gbps", bh},
                        {"both_d2h_gbps", bd},
                        {"target", a.target},
                        {"target_met", met}};
    write_output(a.json, j.dump(2) + "\n", "--json");
  }
  return met ? 0 : 1;
}

const command_registration registration{"copies", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<copies_args>();
  auto* cmd = app.add_subcommand("copies", "pinned host <-> device copies against a plain copy loop, same run");
  examples::add_config_flags(*cmd, args->config, {"backend", "cpu_device_memory", "cpu_callback_seed"});
  cmd->add_option("--size", args->size, "bytes per copy (e.g. 256MiB)")->capture_default_str();
  cmd->add_option("--copies", args->copies, "copies per timed turn")->capture_default_str()->check(whole_number_in(1, 1000000));
  cmd->add_option("--repeats", args->repeats, "timed turns per side (best taken)")->capture_default_str()->check(whole_number_in(1, 1000));
  cmd->add_option("--target", args->target, "least ratio to the plain loop")->capture_default_str()->check(positive_number);
  cmd->add_option("--json", args->json, "write the figures as JSON")->check(writable_file);
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}};

}  // namespace
}  // namespace spillway::bench
