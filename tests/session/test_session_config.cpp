// The Session's one config struct from code, JSON and SPILLWAY_* variables; every bad value is
// refused with the key or variable named and the value quoted.
#include <gtest/gtest.h>

#include <cstdlib>

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
}  // namespace

TEST(SessionConfig, FromEnvironment) {
  env_guard g({{"SPILLWAY_DEVICE", "cpu"},
               {"SPILLWAY_DEVICE_BUDGET", "6GiB"},
               {"SPILLWAY_HOST_BUDGET", "1.5GB"},
               {"SPILLWAY_NVME_PATHS", "/mnt/a,/mnt/b"},
               {"SPILLWAY_POLICY", "lms"},
               {"SPILLWAY_LMS_SWAPIN_AHEAD", "3"},
               {"SPILLWAY_LINK_GBPS", "12.5"}});
  const auto c = session_config::from_env();
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.device_budget, 6_GiB);
  EXPECT_EQ(c.host_budget, 1500000000ULL);
  EXPECT_EQ(c.nvme_paths, (std::vector<std::string>{"/mnt/a", "/mnt/b"}));
  EXPECT_EQ(c.policy, "lms");
  EXPECT_EQ(c.lms_swapin_ahead, 3u);
  EXPECT_DOUBLE_EQ(c.link_gbps, 12.5);
  EXPECT_NO_THROW(c.validate());
}

TEST(SessionConfig, BadEnvironmentValuesNameTheVariable) {
  {
    env_guard g({{"SPILLWAY_DEVICE_BUDGET", "12XB"}});
    try {
      (void)session_config::from_env();
      FAIL();
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find("SPILLWAY_DEVICE_BUDGET"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("\"12XB\""), std::string::npos);
    }
  }
  {
    env_guard g({{"SPILLWAY_LMS_SWAPIN_AHEAD", "-2"}});
    EXPECT_THROW((void)session_config::from_env(), config_error);
  }
  {
    env_guard g({{"SPILLWAY_POLICY", "greedy"}});
    const auto c = session_config::from_env();
    try {
      c.validate();
      FAIL();
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find("\"greedy\""), std::string::npos);
    }
  }
}

TEST(SessionConfig, FromJson) {
  const auto c = session_config::from_json_text(
      R"({"device": "cpu", "device_budget": "512MiB", "host_budget": 1048576, "nvme_paths": ["/a"],
          "policy": "vdnn", "vdnn_variant": "conv", "link_gbps": 8})");
  EXPECT_EQ(c.device_budget, 512_MiB);
  EXPECT_EQ(c.host_budget, 1_MiB);
  EXPECT_EQ(c.nvme_paths, std::vector<std::string>{"/a"});
  EXPECT_EQ(c.vdnn_variant, "conv");
  EXPECT_DOUBLE_EQ(c.link_gbps, 8.0);
}

TEST(SessionConfig, BadJsonNamesTheKey) {
  for (const char* text : {R"({"device_budgets": "1GiB"})", R"({"device_budget": "-3GiB"})",
                           R"({"nvme_paths": "/a"})", R"({"policy": 3.5})", R"([1, 2])", R"({"device": )"}) {
    EXPECT_THROW((void)session_config::from_json_text(text), config_error) << text;
  }
  try {
    (void)session_config::from_json_text(R"({"device_budgets": "1GiB"})");
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"device_budgets\""), std::string::npos) << e.what();
  }
}
