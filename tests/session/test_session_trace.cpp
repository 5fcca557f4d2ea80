// The Chrome trace of real iterations: a compute track with every op, copy tracks, NVMe read and
// write tracks when tensors spill to the NVMe tier, and the device-memory counter with the
// budget beside it, never above it (the recompute track: test_session_recompute.cpp).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "../swap/swap_test_support.hpp"
#include "device/units.hpp"
#include "offload/swap_policy.hpp"
#include "watchdog.hpp"

using namespace spillway;
using namespace spillway::literals;

TEST(SessionTrace, ChromeTraceHasComputeCopyAndNvmeTracksAndTheBudgetLine) {
  spillway::testing::watchdog dog("ChromeTraceHasComputeCopyAndNvmeTracksAndTheBudgetLine", std::chrono::seconds(60));
  test::temp_dir dir;
  const std::string path = dir.path() + "/trace.json";
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.device_budget = 320_KiB;
  c.policy = "auto";
  c.link_gbps = 0;
  c.host_budget = 4_KiB;  // what leaves the device goes to NVMe
  c.nvme.directories = {dir.path()};
  c.nvme.reserve = 16_MiB;
  c.chrome_trace = path;
  constexpr int layers = 8, iterations = 3;
  {
    Session s(c);
    std::vector<unsigned char> init(64_KiB, 1);
    std::vector<tensor_handle> w;
    for (int i = 0; i < layers; ++i)
      w.push_back(s.add_persistent("w" + std::to_string(i), init.size(), tensor_kind::parameter, init.data()));
    for (int it = 0; it < iterations; ++it) {
      s.begin_iteration();
      tensor_handle prev = s.add_transient("x", 32_KiB);
      { auto op = s.op("input", {}, {prev}); }
      for (int i = 0; i < layers; ++i) {
        auto next = s.add_transient("a" + std::to_string(i), 32_KiB);
        { auto op = s.op("layer" + std::to_string(i), {w[i], prev}, {next}); }
        s.release(prev);
        prev = next;
      }
      for (int i = layers - 1; i >= 0; --i) {
        auto op = s.op("update" + std::to_string(i), {w[i], prev}, {w[i]});
      }
      s.release(prev);
      (void)s.end_iteration();
    }
  }  // the Session writes the trace when it closes

  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "no trace at " << path;
  const auto j = nlohmann::json::parse(in);
  std::map<int, std::string> tracks;
  std::map<int, int> spans;
  int counters = 0;
  for (const auto& e : j.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "M" && e.at("name") == "thread_name") tracks[e.at("tid").get<int>()] = e.at("args").at("name");
    if (ph == "X") {
      ++spans[e.at("tid").get<int>()];
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
    }
    if (ph == "C") {
      ++counters;
      EXPECT_EQ(e.at("args").at("budget").get<std::uint64_t>(), c.device_budget);
      EXPECT_LE(e.at("args").at("in use").get<std::uint64_t>(), c.device_budget);
    }
  }
  const std::set<std::string> names = [&] {
    std::set<std::string> n;
    for (auto& [tid, name] : tracks) n.insert(name);
    return n;
  }();
  for (const char* want : {"compute", "copy host->device", "copy device->host", "nvme read", "nvme write"})
    EXPECT_TRUE(names.count(want)) << "no track named " << want;
  auto count_on = [&](const std::string& name) {
    for (auto& [tid, n] : tracks)
      if (n == name) return spans[tid];
    return 0;
  };
  EXPECT_EQ(count_on("compute"), iterations * (1 + 2 * layers)) << "every op of every iteration, once";
  EXPECT_GT(count_on("copy device->host"), 0);
  EXPECT_GT(count_on("copy host->device"), 0);
  EXPECT_GT(count_on("nvme write"), 0) << "tensors spilled to NVMe but no write shows";
  EXPECT_GT(count_on("nvme read"), 0) << "tensors came back from NVMe but no read shows";
  EXPECT_GT(counters, 0);
}

