// Tests of the hardware profiles: built-ins are complete, JSON loads, errors name the field,
// op durations follow the roofline unless measured.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "offload/profile.hpp"

namespace spillway::offload {
namespace {

TEST(Profile, BuiltinsAreValidAndOrdered) {
  const auto names = builtin_profile_names();
  ASSERT_EQ(names.size(), 5u);  // h200, a100-80g, v100-32g, v100-16g, titanx-12g
  for (const auto& n : names) EXPECT_NO_THROW(get_profile(n).validate()) << n;
  const auto h200 = get_profile("h200"), v100 = get_profile("v100-16g"), titan = get_profile("titanx-12g");
  EXPECT_EQ(h200.device_bytes, 141'000'000'000ull);
  EXPECT_GT(h200.h2d_bytes_per_s, v100.h2d_bytes_per_s);  // PCIe Gen5 vs Gen3
  EXPECT_NEAR(titan.compute_flops_per_s, 6.1e12 * 0.7, 1e9);
  EXPECT_THROW(get_profile("tpu"), config_error);
}

TEST(Profile, JsonRoundTripAndErrors) {
  const auto p = get_profile("a100-80g");
  const auto back = profile_from_json(profile_to_json(p));
  EXPECT_EQ(back.device_bytes, p.device_bytes);
  EXPECT_DOUBLE_EQ(back.h2d_bytes_per_s, p.h2d_bytes_per_s);
  auto j = profile_to_json(p);
  j.erase("h2d_gbps");
  try {
    (void)profile_from_json(j);
    FAIL();
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("h2d_gbps"), std::string::npos);
  }
  j = profile_to_json(p);
  j["device_memory"] = "16GB";
  j["name"] = "mine";
  const std::string path = ::testing::TempDir() + "spillway_profile_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << j.dump();
  const auto loaded = get_profile(path);
  EXPECT_EQ(loaded.name, "mine");
  EXPECT_EQ(loaded.device_bytes, 16'000'000'000ull);
  std::remove(path.c_str());
}

TEST(Profile, AFileErrorNamesTheFileAndTheKey) {
  auto j = profile_to_json(get_profile("v100-16g"));
  j["hbm_gbps"] = -3;
  const std::string path = ::testing::TempDir() + "spillway_bad_profile_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << j.dump();
  try {
    (void)get_profile(path);
    ADD_FAILURE() << "a negative hbm_gbps was accepted";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;  // the file first
    EXPECT_NE(msg.find("'hbm_gbps' must be positive, got -3"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("[at "), std::string::npos) << msg;  // bad input carries no source location
  }
  std::remove(path.c_str());
  try {
    (void)get_profile(path);  // gone now
    ADD_FAILURE() << "a missing profile file was accepted";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": cannot open", 0), 0u) << msg;
    EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
  }
  std::filesystem::create_directory(path);  // a folder named like a profile
  try {
    (void)get_profile(path);
    ADD_FAILURE() << "a folder was read as a profile";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": is a folder; give a hardware profile JSON file", 0), 0u) << msg;
  }
  std::filesystem::remove(path);
}

TEST(Profile, OddValuesAreConfigErrors) {
  const auto base = profile_to_json(get_profile("v100-16g"));
  auto j = base;
  j["name"] = 7;  // not a string
  EXPECT_THROW((void)profile_from_json(j), config_error);
  j = base;
  j["d2h_gbps"] = 1e308;  // finite here, past a double once in bytes per second
  EXPECT_THROW((void)profile_from_json(j), config_error);
  j = base;
  j["copy_engines"] = 2.5;
  EXPECT_THROW((void)profile_from_json(j), config_error);
  j = base;
  j["device_memory"] = 1ULL << 60;  // above the largest size Spillway accepts
  EXPECT_THROW((void)profile_from_json(j), config_error);
}

TEST(Profile, OpSeconds) {
  hw_profile hw = get_profile("v100-16g");
  op_desc op;
  op.flops = hw.compute_flops_per_s;  // 1 s of compute
  op.bytes = 1;
  EXPECT_DOUBLE_EQ(hw.op_seconds(op), 1.0);
  op.flops = 0;
  op.bytes = static_cast<std::uint64_t>(hw.hbm_bytes_per_s * 2);
  EXPECT_NEAR(hw.op_seconds(op), 2.0, 1e-9);
  op.measured_seconds = 0.25;
  EXPECT_DOUBLE_EQ(hw.op_seconds(op), 0.25);
}

}  // namespace
}  // namespace spillway::offload
