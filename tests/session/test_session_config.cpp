// The Session's one config struct from code, JSON, SPILLWAY_* variables and flags: one name per
// setting, the order of precedence, old and unknown names refused, and every bad value refused
// with the input it came from named.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdlib>
#include <fstream>

#include "../swap/swap_test_support.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/session_config.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {
struct env_guard {
  explicit env_guard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) {
      names.push_back(k);
      setenv(k, v, 1);
    }
  }
  ~env_guard() {
    for (auto* k : names) unsetenv(k);
  }
  std::vector<const char*> names;
};

/// The message of the config_error `f` throws; fails the test when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const config_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no config_error";
  return {};
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST(SessionConfig, EachSettingHasOneNameForFlagVariableAndKey) {
  EXPECT_EQ(session_config::flag_of("nvme.reserve"), "--nvme-reserve");
  EXPECT_EQ(session_config::variable_of("nvme.reserve"), "SPILLWAY_NVME_RESERVE");
  EXPECT_EQ(session_config::flag_of("cpu_device_memory"), "--cpu-device-memory");
  EXPECT_EQ(session_config::variable_of("nvme.directories"), "SPILLWAY_NVME_DIRECTORIES");
  std::vector<std::string> keys;
  for (const auto& s : session_config::settings()) keys.emplace_back(s.key);
  for (const char* k : {"backend", "cpu_device_memory", "cpu_callback_seed", "link_gbps", "device_budget", "host_budget",
                        "nvme.directories", "nvme.reserve", "policy", "vdnn_variant", "chrome_trace"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
}

TEST(SessionConfig, FromEnvironment) {
  env_guard g({{"SPILLWAY_BACKEND", "cpu"},
               {"SPILLWAY_DEVICE_BUDGET", "6GiB"},
               {"SPILLWAY_HOST_BUDGET", "1.5GB"},
               {"SPILLWAY_NVME_DIRECTORIES", "/mnt/a,/mnt/b"},
               {"SPILLWAY_NVME_RESERVE", "4GiB"},
               {"SPILLWAY_POLICY", "lms"},
               {"SPILLWAY_LMS_SWAPIN_AHEAD", "3"},
               {"SPILLWAY_CPU_DEVICE_MEMORY", "96MiB"},
               {"SPILLWAY_CPU_CALLBACK_SEED", "42"},
               {"SPILLWAY_LINK_GBPS", "12.5"}});
  const auto c = session_config::from_env();
  EXPECT_EQ(c.backend, "cpu");
  EXPECT_EQ(c.device_budget, 6_GiB);
  EXPECT_EQ(c.host_budget, 1500000000ULL);
  EXPECT_EQ(c.nvme.directories, (std::vector<std::string>{"/mnt/a", "/mnt/b"}));
  EXPECT_EQ(c.nvme.reserve, 4_GiB);
  EXPECT_EQ(c.policy, "lms");
  EXPECT_EQ(c.lms_swapin_ahead, 3u);
  EXPECT_EQ(c.cpu_device_memory, 96_MiB);
  EXPECT_EQ(c.cpu_callback_seed, 42u);
  EXPECT_DOUBLE_EQ(c.link_gbps, 12.5);
  EXPECT_EQ(c.source_of("policy"), "SPILLWAY_POLICY");
}

TEST(SessionConfig, BadEnvironmentValuesNameTheVariable) {
  {
    env_guard g({{"SPILLWAY_DEVICE_BUDGET", "12XB"}});
    const auto msg = error_of([] { (void)session_config::from_env(); });
    EXPECT_TRUE(has(msg, "SPILLWAY_DEVICE_BUDGET")) << msg;
    EXPECT_TRUE(has(msg, "\"12XB\"")) << msg;
    EXPECT_FALSE(has(msg, "[at ")) << "a config_error carries no source location: " << msg;
  }
  {
    env_guard g({{"SPILLWAY_LMS_SWAPIN_AHEAD", "-2"}});
    EXPECT_TRUE(has(error_of([] { (void)session_config::from_env(); }), "SPILLWAY_LMS_SWAPIN_AHEAD"));
  }
  {
    env_guard g({{"SPILLWAY_POLICY", "greedy"}});
    const auto c = session_config::from_env();
    const auto msg = error_of([&] { c.validate(); });
    EXPECT_TRUE(has(msg, "SPILLWAY_POLICY: 'greedy' is not a policy")) << msg;
  }
}

TEST(SessionConfig, OldAndUnknownVariablesAreRefused) {
  {
    env_guard g({{"SPILLWAY_NVME_PATHS", "/mnt/a"}});
    const auto msg = error_of([] { (void)session_config::from_env(); });
    EXPECT_TRUE(has(msg, "SPILLWAY_NVME_PATHS")) << msg;
    EXPECT_TRUE(has(msg, "SPILLWAY_NVME_DIRECTORIES")) << msg;
  }
  {
    env_guard g({{"SPILLWAY_DEVICE", "cpu"}});
    EXPECT_TRUE(has(error_of([] { (void)session_config::from_env(); }), "SPILLWAY_BACKEND"));
  }
  {
    env_guard g({{"SPILLWAY_POLICYY", "auto"}});
    const auto msg = error_of([] { (void)session_config::from_env(); });
    EXPECT_TRUE(has(msg, "SPILLWAY_POLICYY is not a Spillway setting")) << msg;
    EXPECT_TRUE(has(msg, "SPILLWAY_POLICY,")) << "the known variables are listed: " << msg;
  }
}

TEST(SessionConfig, FromJson) {
  const auto c = session_config::from_json_text(
      R"({"backend": "cpu", "device_budget": "512MiB", "host_budget": 1048576,
          "nvme": {"directories": ["/a", "/b"], "reserve": "4GiB"},
          "policy": "vdnn", "vdnn_variant": "conv", "link_gbps": 8.5, "cpu_callback_seed": 9})",
      "run.json");
  EXPECT_EQ(c.backend, "cpu");
  EXPECT_EQ(c.device_budget, 512_MiB);
  EXPECT_EQ(c.host_budget, 1_MiB);
  EXPECT_EQ(c.nvme.directories, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(c.nvme.reserve, 4_GiB);
  EXPECT_EQ(c.vdnn_variant, "conv");
  EXPECT_DOUBLE_EQ(c.link_gbps, 8.5);
  EXPECT_EQ(c.cpu_callback_seed, 9u);
  EXPECT_EQ(c.source_of("nvme.reserve"), "run.json: nvme.reserve");
}

TEST(SessionConfig, BadJsonNamesTheKeyAndTheFile) {
  for (const char* text : {R"({"device_budgets": "1GiB"})", R"({"device_budget": "-3GiB"})",
                           R"({"nvme": {"directories": "/a"}})", R"({"nvme": ["/a"]})", R"({"nvme": {"dirs": []}})",
                           R"({"policy": 3.5})", R"([1, 2])", R"({"backend": )"}) {
    EXPECT_THROW((void)session_config::from_json_text(text, "run.json"), config_error) << text;
  }
  auto msg = error_of([] { (void)session_config::from_json_text(R"({"device_budgets": "1GiB"})", "run.json"); });
  EXPECT_TRUE(has(msg, "run.json: device_budgets")) << msg;
  msg = error_of([] { (void)session_config::from_json_text(R"({"nvme_paths": ["/a"]})", "run.json"); });
  EXPECT_TRUE(has(msg, "nvme.directories")) << "an old key says its new name: " << msg;
  msg = error_of([] { (void)session_config::from_json_text(R"({"nvme": {"reserve": "4XB"}})", "run.json"); });
  EXPECT_TRUE(has(msg, "run.json: nvme.reserve")) << msg;
  EXPECT_TRUE(has(msg, "\"4XB\"")) << msg;
}

TEST(SessionConfig, PrecedenceIsDefaultThenFileThenVariableThenFlag) {
  test::temp_dir dir;
  const std::string file = dir.path() + "/run.json";
  std::ofstream(file) << R"({"policy": "lms", "host_budget": "1GiB", "device_budget": "2GiB"})";
  env_guard g({{"SPILLWAY_HOST_BUDGET", "512MiB"}, {"SPILLWAY_DEVICE_BUDGET", "256MiB"}});
  auto c = session_config::from_json_file(file);
  c.apply_env();
  c.set("device_budget", "128MiB", "--device-budget");
  EXPECT_EQ(c.policy, "lms");              // file over default
  EXPECT_EQ(c.host_budget, 512_MiB);       // variable over file
  EXPECT_EQ(c.device_budget, 128_MiB);     // flag over variable
  EXPECT_EQ(c.vdnn_variant, "all");        // default
  EXPECT_EQ(c.source_of("policy"), file + ": policy");
  EXPECT_EQ(c.source_of("device_budget"), "--device-budget");
  c.policy = "greedy";  // code after loading: the file no longer speaks for the value
  EXPECT_EQ(c.source_of("policy"), "policy");
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "policy: 'greedy'"));
}

TEST(SessionConfig, ValidateChecksTheNvmeDirectories) {
  session_config c;
  c.set("nvme.directories", "/nonexistent/spillway-swap", "--nvme-directories");
  auto msg = error_of([&] { c.validate(); });
  EXPECT_TRUE(has(msg, "--nvme-directories: '/nonexistent/spillway-swap'")) << msg;

  test::temp_dir dir;
  const std::string file = dir.path() + "/not-a-dir";
  std::ofstream(file) << "x";
  c.nvme.directories = {file};
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "is not a directory"));

  c.nvme.directories = {dir.path(), dir.path()};
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "listed twice"));

  c.nvme.directories = {dir.path()};
  EXPECT_NO_THROW(c.validate());
  if (::geteuid() != 0) {  // root writes anywhere
    test::temp_dir locked;
    ::chmod(locked.path().c_str(), 0500);
    c.nvme.directories = {locked.path()};
    EXPECT_TRUE(has(error_of([&] { c.validate(); }), "is not writable"));
  }
}

TEST(SessionConfig, ValidateChecksTheReserveFitsTheFreeSpace) {
  test::temp_dir dir;
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &vfs), 0);
  const std::uint64_t free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  session_config c;
  c.nvme.directories = {dir.path()};
  c.nvme.reserve = 64_MiB;
  EXPECT_NO_THROW(c.validate());
  if (free + 1_GiB < max_size_bytes) {
    c.set("nvme.reserve", std::to_string(free + 1_GiB), "SPILLWAY_NVME_RESERVE");
    const auto msg = error_of([&] { c.validate(); });
    EXPECT_TRUE(has(msg, "SPILLWAY_NVME_RESERVE")) << msg;
    EXPECT_TRUE(has(msg, "does not fit")) << msg;
  }
  session_config none;
  none.nvme.reserve = 64_MiB;  // a reserve without a directory
  EXPECT_TRUE(has(error_of([&] { none.validate(); }), "no NVMe directory"));
}
