// The examples' option loading: --config FILE < SPILLWAY_* variables < flags, every bad value
// refused before any work with the flag, variable or file it came from named, and old names
// refused with the new one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "../swap/swap_test_support.hpp"
#include "device/error.hpp"
#include "examples/common/report.hpp"
#include "device/units.hpp"
#include "examples/common/flags.hpp"

namespace spillway::examples {
namespace {

using namespace spillway::literals;

/// Sets variables for one scope and restores what was there before.
class env_scope {
 public:
  explicit env_scope(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) {
      const char* old = std::getenv(k);
      saved_.emplace_back(k, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
      setenv(k, v, 1);
    }
  }
  ~env_scope() {
    for (const auto& [k, v] : saved_) {
      if (v)
        setenv(k.c_str(), v->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
  }
  env_scope(const env_scope&) = delete;
  env_scope& operator=(const env_scope&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

/// What an example program does with its command line before any work: parse and load.
example_options load(std::vector<std::string> args) {
  CLI::App app{"test"};
  flag_values flags;
  add_common_flags(app, flags, true);
  args.insert(args.begin(), "oversized_test");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return to_options(flags);
}

std::string error_of(std::vector<std::string> args) {
  try {
    (void)load(std::move(args));
  } catch (const config_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no config_error";
  return {};
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The message CLI11 gives for `args` when a check refuses a flag's value while parsing.
std::string parse_error_of(std::vector<std::string> args) {
  try {
    (void)load(std::move(args));
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no parse error";
  return {};
}

// The count and amount checks the bench's flags share: the ends of the range pass, one past
// either end, a sign, a fraction and a count past 2^64 - 1 are refused with the range.
TEST(ExampleOptions, TheCollectivesTimeoutIsSecondsFromZeroUp) {
  EXPECT_EQ(load({}).comm_timeout_s, 120);
  EXPECT_EQ(load({"--comm-timeout", "600"}).comm_timeout_s, 600);
  EXPECT_EQ(load({"--comm-timeout", "0"}).comm_timeout_s, 0);
  for (const char* bad : {"-1", "nan", "1e8"}) {
    const auto e = error_of({"--comm-timeout", bad});
    EXPECT_TRUE(has(e, "--comm-timeout") && has(e, "give one from 0")) << bad << ": " << e;
  }
}

TEST(ExampleOptions, CountsAndPositiveAmountsAreCheckedAtTheEndsOfTheirRange) {
  auto error_of = [](const CLI::Validator& v, std::string text) { return v(text); };
  const auto repeats = whole_number_in(1, 1000);
  for (const char* ok : {"1", "1000", "0007"}) EXPECT_EQ(error_of(repeats, ok), "") << ok;
  for (const char* bad : {"0", "1001", "-1", "+3", "2.5", "", "1e3", "18446744073709551616"})
    EXPECT_EQ(error_of(repeats, bad), std::string("cannot use \"") + bad + "\": give a whole number from 1 to 1000") << bad;
  for (const char* ok : {"0.001", "30", "1e3"}) EXPECT_EQ(error_of(positive_number, ok), "") << ok;
  for (const char* bad : {"0", "-1", "nan", "inf", "", "3s"})
    EXPECT_EQ(error_of(positive_number, bad), std::string("cannot use \"") + bad + "\": give a number above 0") << bad;
}

TEST(ExampleOptions, SeedsAndOutputPathsAreCheckedWhenTheFlagsAreRead) {
  for (const char* seed : {"-1", "18446744073709551616", "1.5", "12abc", "99999999999999999999999"}) {
    const auto msg = parse_error_of({"--seed", seed});
    EXPECT_TRUE(has(msg, "--seed")) << seed << ": " << msg;
    EXPECT_TRUE(has(msg, "whole number from 0 to 18446744073709551615")) << seed << ": " << msg;
  }
  EXPECT_EQ(load({"--seed", "18446744073709551615"}).seed, 18446744073709551615ULL);
  EXPECT_EQ(load({"--seed", "007"}).seed, 7u);
  const auto msg = parse_error_of({"--report", "/nonexistent-folder/run.json"});
  EXPECT_TRUE(has(msg, "--report")) << msg;
  EXPECT_TRUE(has(msg, "the folder '/nonexistent-folder' does not exist")) << msg;
  spillway::test::temp_dir d;
  const auto folder = parse_error_of({"--report", d.path()});
  EXPECT_TRUE(has(folder, "--report")) << folder;
  EXPECT_TRUE(has(folder, "it is a folder; give a file name in it")) << "refused before the run, not after it: " << folder;
  EXPECT_EQ(load({"--report", d.path() + "/run.json"}).steps, example_options{}.steps);
  EXPECT_TRUE(std::filesystem::is_empty(d.path())) << "the check left an entry behind";
  // One left there by an earlier process with this id does not make the folder unwritable.
  std::filesystem::create_directory(d.path() + "/.spillway-write-check-" + std::to_string(::getpid()));
  EXPECT_EQ(load({"--report", d.path() + "/run.json"}).steps, example_options{}.steps);
  // A folder whose file system refuses new files though access() allows them (procfs).
  if (std::filesystem::is_directory("/proc/self")) {
    const auto refused = parse_error_of({"--report", "/proc/run.json"});
    EXPECT_TRUE(has(refused, "the folder '/proc' is not writable")) << refused;
  }
}

TEST(ExampleOptions, BadVariablesAreRefusedNamingThem) {
  {
    env_scope e({{"SPILLWAY_POLICY", "greedy"}});
    const auto msg = error_of({});
    EXPECT_TRUE(has(msg, "SPILLWAY_POLICY: 'greedy' is not a policy")) << msg;
  }
  {
    env_scope e({{"SPILLWAY_NVME_DIRECTORIES", "/nonexistent"}});
    const auto msg = error_of({});
    EXPECT_TRUE(has(msg, "SPILLWAY_NVME_DIRECTORIES: '/nonexistent'")) << msg;
  }
  {
    env_scope e({{"SPILLWAY_NVME_PATHS", "/tmp"}});
    const auto msg = error_of({});
    EXPECT_TRUE(has(msg, "SPILLWAY_NVME_DIRECTORIES")) << "the old name says the new one: " << msg;
  }
  {
    env_scope e({{"SPILLWAY_POLCY", "auto"}});
    EXPECT_TRUE(has(error_of({}), "SPILLWAY_POLCY is not a Spillway setting"));
  }
  {
    env_scope e({{"SPILLWAY_DEVICE_BUDGET", "1GiB"}});
    const auto msg = error_of({"--budget-ratio", "0.5"});
    EXPECT_TRUE(has(msg, "--budget-ratio and SPILLWAY_DEVICE_BUDGET")) << msg;
  }
}

TEST(ExampleOptions, FlagsOverrideVariablesWhichOverrideTheConfigFile) {
  test::temp_dir dir;
  const std::string file = dir.path() + "/run.json";
  std::ofstream(file) << R"({"policy": "vdnn", "host_budget": "1GiB", "nvme": {"reserve": "8MiB"}})";
  env_scope e({{"SPILLWAY_HOST_BUDGET", "256MiB"}, {"SPILLWAY_POLICY", "lms"}});
  const auto o = load({"--config", file, "--policy", "none", "--nvme-directories", dir.path(), "--steps", "3"});
  EXPECT_EQ(o.policy, "none");          // flag over variable
  EXPECT_EQ(o.host_budget, 256_MiB);    // variable over file
  EXPECT_EQ(o.nvme.reserve, 8_MiB);     // file over default
  EXPECT_EQ(o.nvme.directories, std::vector<std::string>{dir.path()});
  EXPECT_EQ(o.steps, 3);
  EXPECT_EQ(o.source_of("policy"), "--policy");
  EXPECT_EQ(o.source_of("nvme.reserve"), file + ": nvme.reserve");
}

TEST(ExampleOptions, EverySettingHasItsFlagAndBadFlagValuesNameTheFlag) {
  test::temp_dir a, b;
  const auto o = load({"--backend", "cpu", "--cpu-device-memory", "96MiB", "--cpu-callback-seed", "5", "--device-budget",
                       "32MiB", "--nvme-directories", a.path() + "," + b.path(), "--nvme-reserve", "4MiB", "--link-gbps",
                       "12"});
  EXPECT_EQ(o.backend, "cpu");
  EXPECT_EQ(o.cpu_device_memory, 96_MiB);
  EXPECT_EQ(o.cpu_callback_seed, 5u);
  EXPECT_EQ(o.device_budget, 32_MiB);
  EXPECT_EQ(o.nvme.directories, (std::vector<std::string>{a.path(), b.path()}));
  EXPECT_EQ(o.nvme.reserve, 4_MiB);
  EXPECT_DOUBLE_EQ(o.link_gbps, 12.0);
  auto msg = error_of({"--nvme-reserve", "4XB"});
  EXPECT_TRUE(has(msg, "--nvme-reserve: cannot use \"4XB\"")) << msg;
  msg = error_of({"--backend", "tpu"});
  EXPECT_TRUE(has(msg, "--backend: 'tpu' is not a backend")) << msg;
  msg = error_of({"--nvme-directories", "/nonexistent"});
  EXPECT_TRUE(has(msg, "--nvme-directories: '/nonexistent'")) << msg;
}

TEST(ExampleOptions, OldFlagsAreRefusedWithTheNewName) {
  auto msg = error_of({"--nvme-dir", "/tmp"});
  EXPECT_TRUE(has(msg, "--nvme-directories")) << msg;
  msg = error_of({"--device-memory", "64MiB"});
  EXPECT_TRUE(has(msg, "--cpu-device-memory")) << msg;
}


// The examples' --budget-ratio is the Session's device_budget_ratio, named by the example's flag;
// --device-budget-ratio, from the settings table, works too, and not both at once.
TEST(ExampleOptions, BudgetRatioIsTheSessionsDeviceBudgetRatio) {
  {
    const auto o = load({"--budget-ratio", "0.25"});
    const auto c = make_session_config(o, 0);
    EXPECT_DOUBLE_EQ(c.device_budget_ratio, 0.25);
    EXPECT_EQ(c.source_of("device_budget_ratio"), "--budget-ratio");
  }
  {
    const auto o = load({"--device-budget-ratio", "0.5"});
    EXPECT_DOUBLE_EQ(make_session_config(o, 0).device_budget_ratio, 0.5);
  }
  EXPECT_TRUE(has(error_of({"--device-budget-ratio", "1.5"}), "--device-budget-ratio"));
  const auto both = error_of({"--budget-ratio", "0.5", "--device-budget-ratio", "0.5"});
  EXPECT_TRUE(has(both, "--budget-ratio and --device-budget-ratio")) << both;
}

}  // namespace
TEST(ExampleOptions, AnOutputThatNamesAnInputOrAnotherOutputIsRefusedBeforeAnyWork) {
  spillway::test::temp_dir d;
  const std::string corpus = d.path() + "/corpus.txt", config = d.path() + "/settings.json";
  std::ofstream(corpus) << "some text to train on";
  std::ofstream(config) << "{\"policy\": \"lms\"}";
  const auto report_over_data = error_of({"--data", corpus, "--report", corpus});
  EXPECT_TRUE(has(report_over_data, "--report '" + corpus + "' is the same file as --data")) << report_over_data;
  // Another spelling of the same file, through a link.
  std::filesystem::create_symlink(config, d.path() + "/link.json");
  const auto trace_over_config = error_of({"--config", config, "--chrome-trace", d.path() + "/link.json"});
  EXPECT_TRUE(has(trace_over_config, "--chrome-trace")) << trace_over_config;
  EXPECT_TRUE(has(trace_over_config, "same file as --config")) << trace_over_config;
  // Two outputs, one not written yet, spelled differently.
  const auto two_outputs = error_of({"--report", d.path() + "/run.json", "--chrome-trace", d.path() + "/./run.json"});
  EXPECT_TRUE(has(two_outputs, "another output of the run")) << two_outputs;
  EXPECT_EQ(load({"--data", corpus, "--report", d.path() + "/run.json", "--chrome-trace", d.path() + "/trace.json"}).data,
            corpus);
  std::ifstream in(corpus);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "some text to train on");
}

TEST(ExampleOptions, AChromeTraceInAFolderThatCannotBeWrittenIsRefusedBeforeAnyWork) {
  if (!std::filesystem::is_directory("/proc/self")) GTEST_SKIP() << "no procfs here";
  const auto msg = error_of({"--chrome-trace", "/proc/trace.json"});
  EXPECT_TRUE(has(msg, "--chrome-trace")) << msg;
  EXPECT_TRUE(has(msg, "the folder '/proc' is not writable")) << msg;
}

}  // namespace spillway::examples

// A report the disk cannot hold is an error, not an empty file the program then names: a small
// report is written when the file is closed, so that is where the error shows.
TEST(ExampleReport, AReportTheDiskCannotHoldIsAnIoError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  EXPECT_THROW(spillway::examples::write_report(spillway::examples::run_result{}, "/dev/full"), spillway::io_error);
}

