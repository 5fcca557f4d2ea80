// spillway-bench adam: the CPU Adam's updates per second for fp32 state, against the memory
// bandwidth a STREAM-style triad reaches over the same bytes with the same threads, same run.
#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/adam_measure.hpp"
#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway::bench {
namespace {

struct adam_args {
  std::size_t elements = adam_measure_options{}.elements;
  int repeats = adam_measure_options{}.repeats;
  std::string isa = "best";
  double target = 0.7;
  std::string json;
};

int run(const adam_args& a) {
  adam_measure_options o;
  o.elements = a.elements;
  o.repeats = a.repeats;
  const auto isa = kernels::parse_cpu_isa(a.isa);
  if (!isa) throw config_error("--isa: '" + a.isa + "' is not an instruction set (scalar, avx2, avx512 or best)");
  if (!kernels::cpu_supports(*isa)) throw config_error("--isa: this CPU cannot run " + a.isa);
  o.isa = *isa;
  const adam_measure_result r = measure_adam_against_triad(o);

  const double adam_gbs = r.adam_bytes_per_second() / 1e9, triad_gbs = r.triad_bytes_per_second() / 1e9;
  const bool met = r.ratio() >= a.target;
  std::printf("cpu adam against a STREAM triad, same run: %zu parameters (%s of fp32 state; the triad's 3 buffers "
              "the same bytes), isa %s, %d threads, %s memory, best of %d\n",
              r.elements, format_bytes(r.elements * 16).c_str(), std::string(kernels::to_string(r.isa)).c_str(),
              r.threads, r.numa_placed ? "NUMA-placed" : "plain aligned", r.repeats);
  std::printf("kernel  bytes/element  best ms    GB/s  per second\n");
  std::printf("adam    %13.0f  %7.2f  %6.2f  %.3g updates\n", adam_bytes_per_update, r.adam_seconds * 1e3, adam_gbs,
              r.updates_per_second());
  std::printf("triad   %13.0f  %7.2f  %6.2f  %.3g elements (STREAM's count: the write-allocate read of a is not in it)\n",
              triad_bytes_per_element, r.triad_seconds * 1e3, triad_gbs,
              static_cast<double>(r.triad_elements) / r.triad_seconds);
  std::printf("adam bytes/s / triad bytes/s: %.3f\n", r.ratio());
  std::printf("target: cpu adam at least %gx of the triad bandwidth: %s\n", a.target, met ? "PASS" : "MISS");
  if (!a.json.empty()) {
    nlohmann::json j = {{"elements", r.elements},
                        {"triad_elements", r.triad_elements},
                        {"repeats", r.repeats},
                        {"threads", r.threads},
                        {"isa", std::string(kernels::to_string(r.isa))},
                        {"numa_placed", r.numa_placed},
                        {"adam_seconds", r.adam_seconds},
                        {"triad_seconds", r.triad_seconds},
                        {"adam_bytes_per_update", adam_bytes_per_update},
                        {"triad_bytes_per_element", triad_bytes_per_element},
                        {"updates_per_second", r.updates_per_second()},
                        {"adam_gbps", adam_gbs},
                        {"triad_gbps", triad_gbs},
                        {"ratio", r.ratio()},
                        {"target", a.target},
                        {"target_met", met}};
    write_output(a.json, j.dump(2) + "\n", "--json");
  }
  return met ? 0 : 1;
}

const command_registration registration{"adam", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<adam_args>();
  auto* cmd = app.add_subcommand("adam", "CPU Adam updates per second against a STREAM triad's bandwidth, same run");
  cmd->add_option("--elements", args->elements, "parameters per Adam step (4 fp32 buffers of this many)")
      ->capture_default_str()
      ->check(whole_number_in(1, std::uint64_t{1} << 36));
  cmd->add_option("--repeats", args->repeats, "timed turns of each (best taken)")->capture_default_str()->check(whole_number_in(1, 1000));
  cmd->add_option("--isa", args->isa, "the CPU Adam's body: scalar, avx2, avx512 or best")->capture_default_str();
  cmd->add_option("--target", args->target, "least ratio of Adam's bytes/s to the triad's")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--json", args->json, "write the figures as JSON")->check(writable_file);
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}};

}  // namespace
}  // namespace spillway::bench
