// The Session's one config struct from code, JSON, SPILLWAY_* variables and flags: one name per
// setting, the order of precedence, old and unknown names refused, and every bad value refused
// with the input it came from named.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <set>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../comma_locale.hpp"
#include "../swap/swap_test_support.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/session_config.hpp"
#include "offload/swap_policy.hpp"

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
                        "nvme.directories", "nvme.reserve", "nvme.block_size", "nvme.queue_depth", "nvme.rings", "policy",
                        "vdnn_variant", "chrome_trace"})
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
  {  // set but empty: a script that lost its value, not a request for the default
    env_guard g({{"SPILLWAY_DEVICE_BUDGET", ""}});
    const auto msg = error_of([] { (void)session_config::from_env(); });
    EXPECT_TRUE(has(msg, "SPILLWAY_DEVICE_BUDGET is set but empty")) << msg;
  }
  {  // an emulated device too small to hold anything is refused by its own name
    env_guard g({{"SPILLWAY_CPU_DEVICE_MEMORY", "1"}});
    const auto c = session_config::from_env();
    const auto msg = error_of([&] { c.validate(); });
    EXPECT_TRUE(has(msg, "SPILLWAY_CPU_DEVICE_MEMORY: 1 B is too small")) << msg;
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

TEST(SessionConfig, TheTestSeedIsPassedOverAndOnlyItsExactName) {
  {  // the tests' seed is no setting, and a run of the tests with it set must still build sessions
    env_guard g({{"SPILLWAY_TEST_SEED", "7"}, {"SPILLWAY_POLICY", "lms"}});
    const auto c = session_config::from_env();
    EXPECT_EQ(c.policy, "lms");
  }
  for (const char* near : {"SPILLWAY_TEST_SEEDS", "SPILLWAY_TEST", "SPILLWAY_SEED"}) {
    env_guard g({{near, "7"}});
    const auto msg = error_of([] { (void)session_config::from_env(); });
    EXPECT_TRUE(has(msg, std::string(near) + " is not a Spillway setting")) << msg;
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
  // What spillway-bench tiers --tune writes is a config file too.
  const auto tuned = session_config::from_json_text(
      R"({"nvme": {"directories": ["/a"], "block_size": 524288, "queue_depth": 64, "rings": 2}})", "tuned.json");
  EXPECT_EQ(tuned.nvme.block_size, 512_KiB);
  EXPECT_EQ(tuned.nvme.queue_depth, 64u);
  EXPECT_EQ(tuned.nvme.rings, 2u);
}

TEST(SessionConfig, ValidateChecksTheNvmeTierKnobs) {
  session_config c;
  c.set("nvme.block_size", "1000", "SPILLWAY_NVME_BLOCK_SIZE");
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "SPILLWAY_NVME_BLOCK_SIZE")) << "not a multiple of 512";
  c = session_config{};
  c.set("nvme.queue_depth", "0", "--nvme-queue-depth");
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "--nvme-queue-depth: 0 is not a queue depth"));
  c = session_config{};
  EXPECT_TRUE(has(error_of([&] { c.set("nvme.rings", "65", "--nvme-rings"); }), "--nvme-rings"));
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

// Paths that name a folder where a file is meant are refused by name before any work: the config
// file (not "not valid JSON") and the Chrome trace (not an error after the run).
TEST(SessionConfig, FoldersWhereAFileIsMeantAreRefused) {
  test::temp_dir dir;
  auto msg = error_of([&] { (void)session_config::from_json_file(dir.path()); });
  EXPECT_TRUE(has(msg, dir.path() + ": is a folder; give a JSON file")) << msg;
  msg = error_of([&] { (void)session_config::from_json_file(dir.path() + "/missing.json"); });
  EXPECT_TRUE(has(msg, "missing.json: cannot open the config file: No such file")) << msg;

  session_config c;
  c.set("chrome_trace", dir.path(), "--chrome-trace");
  msg = error_of([&] { c.validate(); });
  EXPECT_TRUE(has(msg, "--chrome-trace: '" + dir.path() + "' is a folder")) << msg;
  EXPECT_TRUE(has(msg, dir.path() + "/trace.json")) << "names a file that would do: " << msg;
  c.set("chrome_trace", dir.path() + "/", "--chrome-trace");
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "is a folder"));
  c.set("chrome_trace", dir.path() + "/trace.json", "--chrome-trace");
  EXPECT_NO_THROW(c.validate());
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
  // The same folder by another name would share one drive's files between two queues.
  c.nvme.directories = {dir.path(), dir.path() + "/."};
  msg = error_of([&] { c.validate(); });
  EXPECT_TRUE(has(msg, "is the folder '" + dir.path() + "' again, by another name")) << msg;

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

// ---- nvme.reserve does what it says ------------------------------------------------------------

namespace {
/// Bytes of the swap files this process holds open in `dir` (unnamed files show in /proc/self/fd
/// as "<dir>/#inode (deleted)" or "<dir>/.spillway-swap-... (deleted)").
std::uint64_t swap_bytes_in(const std::string& dir) {
  std::uint64_t sum = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (ec || !target.starts_with(dir + "/")) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) == 0) sum += static_cast<std::uint64_t>(st.st_size);
  }
  return sum;
}

/// Six 8 MiB parameters under a device budget that holds two and a host tier that holds none:
/// the plan puts the rest on NVMe.
session_config nvme_bound(const std::string& dir, std::uint64_t reserve) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.device_budget = 20_MiB;
  c.host_budget = 4_KiB;
  c.policy = "auto";
  c.link_gbps = 0;
  c.nvme.directories = {dir};
  c.nvme.reserve = reserve;
  return c;
}

void run_iterations(Session& s, int n) {
  std::vector<tensor_handle> w;
  for (int i = 0; i < 6; ++i) w.push_back(s.add_persistent("w" + std::to_string(i), 8_MiB, tensor_kind::parameter));
  for (int it = 0; it < n; ++it) {
    s.begin_iteration();
    for (int i = 0; i < 6; ++i) {
      auto out = s.add_transient("out" + std::to_string(i), 64_KiB);
      { auto op = s.op("forward" + std::to_string(i), {w[i]}, {out}); }
      s.release(out);
    }
    (void)s.end_iteration();
  }
}

/// Bytes the plan in force keeps on NVMe (whole 1 MiB blocks), read from the plan itself.
std::uint64_t planned_nvme_bytes(const Session& s) {
  const plan* p = s.current_plan();
  if (p == nullptr) return 0;
  std::set<tensor_id> ids;
  for (tensor_id i = 0; i < p->initial_tier.size(); ++i)
    if (p->initial_tier[i] == tier::nvme) ids.insert(i);
  for (const auto& step : p->steps) {
    for (const auto& e : step.evictions)
      if (e.action == evict_action::evict_to_nvme) ids.insert(e.tensor);
  }
  return ids.size() * 8_MiB;  // every tensor that can go there is an 8 MiB parameter
}
}  // namespace

TEST(SessionNvmeReserve, ZeroIsSizedFromThePlan) {
  test::temp_dir dir;
  Session s(nvme_bound(dir.path(), 0));
  const std::uint64_t at_start = swap_bytes_in(dir.path());
  EXPECT_GT(at_start, 0u);
  EXPECT_LE(at_start, 16_MiB) << "before a plan the tier holds only a small start";
  run_iterations(s, 3);
  const std::uint64_t planned = planned_nvme_bytes(s);
  EXPECT_GT(planned, at_start) << "the planner was told the file system's free space, not the start reservation";
  EXPECT_GE(swap_bytes_in(dir.path()), planned) << "the tier grew to what the plan places on NVMe";
  for (const auto& r : s.history()) EXPECT_EQ(r.iteration > 1, r.planned) << "iteration " << r.iteration;
}

TEST(SessionNvmeReserve, NonZeroIsReservedAtStartAndIsAllThePlannerGets) {
  test::temp_dir dir;
  Session s(nvme_bound(dir.path(), 48_MiB));
  EXPECT_EQ(swap_bytes_in(dir.path()), 48_MiB);
  run_iterations(s, 3);
  EXPECT_EQ(swap_bytes_in(dir.path()), 48_MiB) << "a fixed reserve never grows";
  EXPECT_LE(planned_nvme_bytes(s), 48_MiB);
}

// A program that set a comma-decimal locale still gives its ratios with a point, as the
// settings table shows them; std::stod read "0.25" as 0 followed by junk there, and refused it.
TEST(SessionConfig, RealsAreReadWithAPointWhateverTheLocale) {
  test::comma_numeric_locale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why_not();
  {
    env_guard g({{"SPILLWAY_DEVICE_BUDGET_RATIO", "0.25"}});
    EXPECT_DOUBLE_EQ(session_config::from_env().device_budget_ratio, 0.25);
  }
  session_config c;
  c.set("device_budget_ratio", " +0.5", "--device-budget-ratio");
  EXPECT_DOUBLE_EQ(c.device_budget_ratio, 0.5);
  for (const char* bad : {"0,25", "", "+", "0.25x", "-0.25", "1e999"}) {
    session_config d;
    EXPECT_TRUE(has(error_of([&] { d.set("device_budget_ratio", bad, "--device-budget-ratio"); }),
                    "give a number >= 0, such as 12.5"))
        << "'" << bad << "'";
  }
}

// device_budget_ratio: one row in the table gives the flag, the variable and the JSON key.
TEST(SessionConfig, DeviceBudgetRatioFromEachInputAndItsChecks) {
  EXPECT_EQ(session_config::flag_of("device_budget_ratio"), "--device-budget-ratio");
  EXPECT_EQ(session_config::variable_of("device_budget_ratio"), "SPILLWAY_DEVICE_BUDGET_RATIO");
  {
    env_guard g({{"SPILLWAY_DEVICE_BUDGET_RATIO", "0.25"}});
    const auto c = session_config::from_env();
    EXPECT_DOUBLE_EQ(c.device_budget_ratio, 0.25);
    EXPECT_NO_THROW(c.validate());
  }
  EXPECT_DOUBLE_EQ(session_config::from_json_text(R"({"device_budget_ratio": 0.5})").device_budget_ratio, 0.5);
  {
    session_config c;
    c.set("device_budget_ratio", "1", "--device-budget-ratio");
    EXPECT_NO_THROW(c.validate());  // the whole footprint is a ratio
  }
  for (const char* bad : {"1.5", "inf", "nan"}) {
    session_config c;
    std::string msg;
    try {
      c.set("device_budget_ratio", bad, "--device-budget-ratio");
      c.validate();
    } catch (const config_error& e) {
      msg = e.what();
    }
    EXPECT_TRUE(has(msg, "--device-budget-ratio")) << bad << ": " << msg;
  }
  EXPECT_TRUE(has(error_of([] {
                    session_config c;
                    c.set("device_budget_ratio", "-0.5", "--device-budget-ratio");
                  }),
                  "--device-budget-ratio"));
  {
    env_guard g({{"SPILLWAY_DEVICE_BUDGET", "1GiB"}, {"SPILLWAY_DEVICE_BUDGET_RATIO", "0.5"}});
    const auto c = session_config::from_env();
    const auto msg = error_of([&] { c.validate(); });
    EXPECT_TRUE(has(msg, "SPILLWAY_DEVICE_BUDGET_RATIO")) << msg;
    EXPECT_TRUE(has(msg, "SPILLWAY_DEVICE_BUDGET both set the device budget")) << msg;
  }
  {
    session_config c;
    c.backend = "cpu";
    c.device_budget_ratio = 2;
    EXPECT_THROW(Session s(c), config_error) << "a Session opens only with a valid ratio";
  }
}

TEST(SessionConfig, TrueFalseSettingsAndTheNvmeIoTimeoutFromEachInput) {
  {
    env_guard g({{"SPILLWAY_CPU_DEBUG_HOST_ACCESS", "yes"}, {"SPILLWAY_NVME_IO_TIMEOUT_MS", "250"}});
    const auto c = session_config::from_env();
    EXPECT_TRUE(c.cpu_debug_host_access);
    EXPECT_EQ(c.nvme.io_timeout_ms, 250u);
  }
  for (const char* off : {"false", "0", "no", "off"}) {
    env_guard g({{"SPILLWAY_CPU_DEBUG_HOST_ACCESS", off}});
    EXPECT_FALSE(session_config::from_env().cpu_debug_host_access) << off;
  }
  const auto j = session_config::from_json_text(R"({"cpu_debug_host_access": true, "nvme": {"io_timeout_ms": 0}})", "run.json");
  EXPECT_TRUE(j.cpu_debug_host_access);
  EXPECT_EQ(j.nvme.io_timeout_ms, 0u);
  EXPECT_EQ(session_config{}.nvme.io_timeout_ms, 30000u);
  {
    env_guard g({{"SPILLWAY_CPU_DEBUG_HOST_ACCESS", "maybe"}});
    const auto e = error_of([] { (void)session_config::from_env(); });
    EXPECT_TRUE(has(e, "SPILLWAY_CPU_DEBUG_HOST_ACCESS")) << e;
    EXPECT_TRUE(has(e, "maybe")) << e;
  }
  {
    env_guard g({{"SPILLWAY_NVME_IO_TIMEOUT_MS", "-5"}});
    const auto e = error_of([] { (void)session_config::from_env(); });
    EXPECT_TRUE(has(e, "SPILLWAY_NVME_IO_TIMEOUT_MS")) << e;
  }
}
