// libFuzzer entry points for the parsers test_fuzz.cpp fuzzes from a fixed corpus: sizes, trace
// JSON, hardware-profile JSON and session-config JSON. Built only with clang (meson option
// `fuzz`), once per target, the target chosen by SPILLWAY_FUZZ_TARGET (1 sizes, 2 trace,
// 3 profile, 4 config). As in the GoogleTest driver, each input is accepted with a result that
// checks out, or refused with config_error; any other exception, a broken property (abort) or a
// memory error is a crash that libFuzzer saves as a reproducer.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "offload/session_config.hpp"
#include "offload/simulator.hpp"
#include "offload/trace_json.hpp"
#include "size_reference.hpp"

#ifndef SPILLWAY_FUZZ_TARGET
#error "SPILLWAY_FUZZ_TARGET must name the target (1 sizes, 2 trace, 3 profile, 4 config)"
#endif

namespace spillway::fuzz {
namespace {

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz property broken: %s\n", what);
  std::abort();
}

[[maybe_unused]] void check_size(const std::string& in) {
  const auto want = reference_size(in);
  std::uint64_t got = 0;
  try {
    got = parse_size(in, "fuzzed size");
  } catch (const config_error& e) {
    require(want.unknown || !want.bytes, "parse_size refused a size the reference accepts");
    require(std::string(e.what()).find("fuzzed size") != std::string::npos, "the message names no setting");
    return;
  }
  require(got > 0 && got <= max_size_bytes, "parse_size accepted a size out of range");
  if (!want.unknown) require(want.bytes.has_value() && *want.bytes == got, "parse_size differs from the reference");
}

[[maybe_unused]] void check_trace(const std::string& in) {
  static const auto hw = offload::get_profile("v100-16g");
  const trace t = offload::trace_from_json_text(in);
  t.validate();
  const auto r = offload::analyze(t);
  require(r.min_budget_bytes <= r.peak_live_bytes, "least budget above the peak");
  for (const auto& d : t.tensors) require(d.bytes <= max_size_bytes, "a tensor past 1 PiB was accepted");
  for (const auto* name : {"none", "lms", "vdnn-all", "auto"}) {
    const auto p = offload::make_planner(name);
    for (std::uint64_t budget : {r.min_budget_bytes, r.peak_live_bytes, std::uint64_t{1} << 30}) {
      if (budget == 0) continue;
      const plan pl = p->make_plan(t, r, hw, budget);
      pl.validate(t);
      const auto sim = offload::simulate(t, r, pl, hw);
      require(std::isfinite(sim.step_seconds) && sim.step_seconds >= 0, "a plan simulated to a bad step time");
    }
  }
}

[[maybe_unused]] void check_profile(const std::string& in) {
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  const auto p = offload::profile_from_json(j);
  p.validate();
  for (double v : {p.compute_flops_per_s, p.hbm_bytes_per_s, p.h2d_bytes_per_s, p.d2h_bytes_per_s,
                   p.nvme_read_bytes_per_s, p.nvme_write_bytes_per_s})
    require(std::isfinite(v) && v > 0, "a profile with a rate that is not positive was accepted");
  require(p.copy_engines >= 1, "a profile without copy engines was accepted");
  require(p.device_bytes > 0 && p.device_bytes <= max_size_bytes, "a profile's device size is out of range");
}

[[maybe_unused]] void check_config(const std::string& in) {
  const auto c = session_config::from_json_text(in);
  c.validate();
  require(c.device_budget <= max_size_bytes && c.host_budget <= max_size_bytes, "a budget past 1 PiB was accepted");
  require(std::isfinite(c.link_gbps) && c.link_gbps >= 0, "a bad link speed was accepted");
}

}  // namespace
}  // namespace spillway::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  try {
#if SPILLWAY_FUZZ_TARGET == 1
    spillway::fuzz::check_size(in);
#elif SPILLWAY_FUZZ_TARGET == 2
    spillway::fuzz::check_trace(in);
#elif SPILLWAY_FUZZ_TARGET == 3
    spillway::fuzz::check_profile(in);
#else
    spillway::fuzz::check_config(in);
#endif
  } catch (const spillway::config_error&) {  // NOLINT(bugprone-empty-catch): a refusal is a fine answer
  }
  return 0;
}
