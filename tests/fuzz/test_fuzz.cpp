// Parser fuzzing without a fuzzing compiler: a GoogleTest driver feeds each parser mutants of a
// corpus kept in the repository (tests/fuzz/corpus/<target>/), a fixed number of inputs per
// target with a time cap, the same mutants every run (the seed is fixed; scripts/soak moves it
// with SPILLWAY_TEST_SEED, tests/test_seed.hpp, for fresh ones). Each parser must
// either accept an input and give a result that checks out, or refuse it with config_error;
// any other exception, a crash or (under scripts/test's ASan+UBSan run) a memory error is a
// failure that prints the input. Options after the GoogleTest ones:
//   --inputs=N    inputs per target (default 30000)
//   --seconds=S   time cap per target (default 60)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "offload/session_config.hpp"
#include "offload/simulator.hpp"
#include "offload/trace_json.hpp"
#include "mutator.hpp"
#include "../test_seed.hpp"
#include "size_reference.hpp"

namespace spillway::fuzz {
namespace {

std::size_t g_inputs = 30000;
double g_seconds = 60;

std::vector<std::string> load_corpus(const std::string& target) {
  std::vector<std::string> out;
  const auto dir = std::filesystem::path(SPILLWAY_FUZZ_CORPUS) / target;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(ss.str());
  }
  std::sort(out.begin(), out.end());  // directory order is not stable; the mutants must be
  return out;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 32 && c < 127 && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

struct run_counts {
  std::size_t inputs = 0, accepted = 0, refused = 0;
};

/// Runs `check` on the corpus itself and then on mutants until g_inputs or g_seconds. `check`
/// returns true when the input was accepted; it throws config_error to refuse; it may also
/// fail GoogleTest assertions. Stops after 5 failing inputs.
run_counts fuzz(const std::string& target, const std::function<bool(const std::string&)>& check) {
  const auto corpus = load_corpus(target);
  EXPECT_FALSE(corpus.empty()) << "no corpus for " << target;
  if (corpus.empty()) return {};
  mutator m(spillway::test::test_seed(0x5eed0000u + target.size()));
  run_counts n;
  int failures = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < g_inputs && failures < 5; ++i) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > g_seconds) break;
    const std::string input = i < corpus.size() ? corpus[i] : m.next(corpus);
    const int before = ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
    try {
      if (check(input)) {
        ++n.accepted;
      } else {
        ++n.refused;
      }
    } catch (const config_error&) {
      ++n.refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << target << ": " << typeid(e).name() << " (not config_error): " << e.what()
                    << "\n  input: " << escaped(input);
    }
    if (::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count() != before) {
      ++failures;
      std::cerr << "  failing input: " << escaped(input) << "\n";
    }
    ++n.inputs;
  }
  return n;
}

// ---- sizes -------------------------------------------------------------------------------------

TEST(Fuzz, SizesParseExactlyAsTheirDigitsSay) {
  // The cases that first showed binary floating point in the parser.
  EXPECT_EQ(parse_size("4.1GB"), 4'100'000'000ULL);
  EXPECT_EQ(parse_size("16.1KB"), 16'100ULL);
  EXPECT_EQ(parse_size("8.2MB"), 8'200'000ULL);
  for (int cents = 1; cents < 2000; ++cents) {  // every two-decimal GB value under 20 GB
    const std::string text = std::to_string(cents / 100) + "." + (cents % 100 < 10 ? "0" : "") +
                             std::to_string(cents % 100) + "GB";
    EXPECT_EQ(parse_size(text), static_cast<std::uint64_t>(cents) * 10'000'000ULL) << text;
  }
  const auto n = fuzz("sizes", [](const std::string& in) {
    const auto want = reference_size(in);
    std::uint64_t got = 0;
    try {
      got = parse_size(in, "fuzzed size");
    } catch (const config_error& e) {
      EXPECT_TRUE(want.unknown || !want.bytes) << "refused \"" << escaped(in) << "\": " << e.what();
      EXPECT_NE(std::string(e.what()).find("fuzzed size"), std::string::npos) << "message names no setting";
      return false;
    }
    EXPECT_GT(got, 0u);
    EXPECT_LE(got, max_size_bytes);
    if (!want.unknown) {
      EXPECT_TRUE(want.bytes.has_value()) << "accepted \"" << escaped(in) << "\" as " << got;
      if (want.bytes) {
        EXPECT_EQ(got, *want.bytes) << escaped(in);
      }
    }
    return true;
  });
  EXPECT_GT(n.accepted, 0u);
  EXPECT_GT(n.refused, 0u);
  std::cout << "sizes: " << n.inputs << " inputs, " << n.accepted << " accepted\n";
}

// ---- trace JSON --------------------------------------------------------------------------------

TEST(Fuzz, TraceJsonIsRefusedOrPlansSanely) {
  const auto hw = offload::get_profile("v100-16g");
  const auto n = fuzz("trace", [&](const std::string& in) {
    const trace t = offload::trace_from_json_text(in);
    t.validate();
    const auto r = offload::analyze(t);
    EXPECT_LE(r.min_budget_bytes, r.peak_live_bytes) << escaped(in);
    for (const auto& d : t.tensors) EXPECT_LE(d.bytes, max_size_bytes) << "a tensor past 1 PiB was accepted";
    for (const auto& name : {"none", "lms", "vdnn-all", "auto"}) {
      const auto p = offload::make_planner(name);
      // At the least budget any plan needs, at the peak (everything fits) and at a fixed one.
      for (std::uint64_t budget : {r.min_budget_bytes, r.peak_live_bytes, std::uint64_t{1} << 30}) {
        if (budget == 0) continue;
        const plan pl = p->make_plan(t, r, hw, budget);
        pl.validate(t);
        const auto sim = offload::simulate(t, r, pl, hw);
        EXPECT_TRUE(std::isfinite(sim.step_seconds) && sim.step_seconds >= 0)
            << name << " step " << sim.step_seconds << " for " << escaped(in);
      }
    }
    return true;
  });
  EXPECT_GT(n.accepted, 0u);
  EXPECT_GT(n.refused, 0u);
  std::cout << "trace: " << n.inputs << " inputs, " << n.accepted << " accepted\n";
}

// ---- hardware profile JSON ---------------------------------------------------------------------

TEST(Fuzz, ProfileJsonIsRefusedOrValid) {
  const auto n = fuzz("profile", [](const std::string& in) {
    const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return false;  // not JSON: get_profile's file path reports that
    const auto p = offload::profile_from_json(j);
    p.validate();
    for (double v : {p.compute_flops_per_s, p.hbm_bytes_per_s, p.h2d_bytes_per_s, p.d2h_bytes_per_s,
                     p.nvme_read_bytes_per_s, p.nvme_write_bytes_per_s})
      EXPECT_TRUE(std::isfinite(v) && v > 0) << "accepted rate " << v << " in " << escaped(in);
    EXPECT_GE(p.copy_engines, 1) << escaped(in);
    EXPECT_GT(p.device_bytes, 0u) << escaped(in);
    EXPECT_LE(p.device_bytes, max_size_bytes) << escaped(in);
    return true;
  });
  EXPECT_GT(n.accepted, 0u);
  EXPECT_GT(n.refused, 0u);
  std::cout << "profile: " << n.inputs << " inputs, " << n.accepted << " accepted\n";
}

// ---- session config JSON -----------------------------------------------------------------------

TEST(Fuzz, SessionConfigJsonIsRefusedOrValid) {
  const auto n = fuzz("config", [](const std::string& in) {
    const auto c = session_config::from_json_text(in);
    c.validate();
    EXPECT_LE(c.device_budget, max_size_bytes) << escaped(in);
    EXPECT_LE(c.host_budget, max_size_bytes) << escaped(in);
    EXPECT_TRUE(std::isfinite(c.link_gbps) && c.link_gbps >= 0) << "link " << c.link_gbps << " in " << escaped(in);
    return true;
  });
  EXPECT_GT(n.accepted, 0u);
  EXPECT_GT(n.refused, 0u);
  std::cout << "config: " << n.inputs << " inputs, " << n.accepted << " accepted\n";
}

}  // namespace
}  // namespace spillway::fuzz

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.starts_with("--inputs=")) spillway::fuzz::g_inputs = std::stoull(a.substr(9));
    else if (a.starts_with("--seconds=")) spillway::fuzz::g_seconds = std::stod(a.substr(10));
  }
  return RUN_ALL_TESTS();
}
