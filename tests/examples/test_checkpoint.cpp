// The examples' checkpoints (--save, --save-every, --resume): a run of 4 steps, and a run of 2
// steps saved and then resumed to 4, give the same losses bit for bit under every policy; the
// checkpoint folders are checked before any work.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "device/error.hpp"
#include "device/units.hpp"
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/report.hpp"
#include "examples/gpt/gpt_model.hpp"
#include "examples/mlp/mlp_model.hpp"
#include "offload/checkpoint.hpp"
#include "../swap/swap_test_support.hpp"

namespace spillway::examples {
namespace {

using literals::operator""_MiB;

using runner = std::function<run_result(const example_options&, const step_observer&)>;

runner runner_for(const std::string& example) {
  if (example == "gpt") return [](const example_options& o, const step_observer& f) { return run_gpt(o, f); };
  if (example == "mlp") return [](const example_options& o, const step_observer& f) { return run_mlp(o, f); };
  return [](const example_options& o, const step_observer& f) { return run_cnn(o, f); };
}

example_options tiny_options(const std::string& policy) {
  example_options o;
  o.backend = "cpu";
  o.cpu_device_memory = 64_MiB;
  o.policy = policy;
  o.budget_ratio = 0.5;  // tensors leave the device in every run
  o.steps = 4;
  o.seed = 7;
  o.size = preset::tiny;
  return o;
}

std::string config_error_of(const example_options& o) {
  try {
    o.validate();
  } catch (const config_error& e) {
    return e.what();
  }
  return "accepted";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// 4 steps in one run; 2 steps saved, then resumed up to 4: the same losses, bit for bit.
void check_resume(const std::string& example, const std::string& policy) {
  SCOPED_TRACE(example + " under " + policy);
  test::temp_dir dir;
  const auto run = runner_for(example);
  const example_options whole = tiny_options(policy);
  const run_result full = run(whole, {});
  ASSERT_EQ(full.losses.size(), 4u);

  example_options first = whole;
  first.steps = 2;
  first.save = dir.path() + "/ck";
  const run_result a = run(first, {});
  EXPECT_EQ(a.saved_to, first.save);
  EXPECT_EQ(a.saved_after, 2);

  example_options second = whole;
  second.resume = first.save;
  std::vector<int> steps_seen;
  const run_result b = run(second, [&](int step, float, const iteration_report&) { steps_seen.push_back(step); });
  EXPECT_EQ(b.first_step, 2);
  EXPECT_EQ(steps_seen, (std::vector<int>{2, 3})) << "the resumed run goes on at step 3 (index 2)";
  ASSERT_EQ(a.losses.size(), 2u);
  ASSERT_EQ(b.losses.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(a.losses[i]), std::bit_cast<std::uint32_t>(full.losses[i]))
        << "step " << i + 1 << ": " << format_loss(a.losses[i]) << " vs " << format_loss(full.losses[i]);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(b.losses[i]), std::bit_cast<std::uint32_t>(full.losses[i + 2]))
        << "step " << i + 3 << ": resumed " << format_loss(b.losses[i]) << ", whole run " << format_loss(full.losses[i + 2]);
  }
}

TEST(ExamplesCheckpoint, ResumedGptGivesTheWholeRunsLossesUnderEveryPolicy) {
  for (const char* policy : {"none", "lms", "vdnn", "auto"}) check_resume("gpt", policy);
}

TEST(ExamplesCheckpoint, ResumedMlpAndCnnGiveTheWholeRunsLosses) {
  check_resume("mlp", "auto");
  check_resume("cnn", "lms");
}

TEST(ExamplesCheckpoint, SaveEveryNStepsAndAtTheEnd) {
  test::temp_dir dir;
  example_options o = tiny_options("auto");
  o.steps = 3;
  o.save = dir.path();
  o.save_every = 2;
  std::vector<std::string> metas;
  const auto r = run_mlp(o, [&](int, float, const iteration_report&) {
    metas.push_back(std::filesystem::exists(dir.path() + "/" + std::string(checkpoint::file_name))
                        ? checkpoint::reader(dir.path()).meta()
                        : "");
  });
  ASSERT_EQ(metas.size(), 3u);
  EXPECT_EQ(metas[0], "") << "saved after step 1 with --save-every 2";
  EXPECT_EQ(parse_meta(metas[1], "test").next_step, 2);
  EXPECT_EQ(parse_meta(checkpoint::reader(dir.path()).meta(), "test").next_step, 3) << "not saved at the end";
  EXPECT_EQ(r.saved_after, 3);
}

// The meta round-trips the shape settings, and one written before they were (step and seed alone)
// still reads, with nothing to check them against.
TEST(ExamplesCheckpoint, MetaCarriesTheShapeSettingsAndOldOnesStillRead) {
  example_options o = tiny_options("auto");
  o.prec = precision::bf16;
  o.micro_batches = 4;
  const resume_point p = parse_meta(to_meta(resume_point_of(o, 5)), "test");
  EXPECT_EQ(p.next_step, 5);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(p.preset, "tiny");
  EXPECT_EQ(p.precision, "bf16");
  EXPECT_EQ(p.micro_batches, 4);
  const resume_point old = parse_meta("spillway-example 1\nnext_step 2\nseed 7\n", "test");
  EXPECT_EQ(old.next_step, 2);
  EXPECT_TRUE(old.preset.empty() && old.precision.empty() && old.micro_batches == 0);
  try {
    (void)parse_meta("spillway-example 1\nnext_step 2\nseed 7\nmicro_batches 0\n", "test");
    ADD_FAILURE() << "0 micro-batches read";
  } catch (const config_error& e) {
    EXPECT_TRUE(has(e.what(), "'micro_batches'")) << e.what();
  }
}

TEST(ExamplesCheckpoint, FoldersAreCheckedBeforeAnyWork) {
  test::temp_dir dir;
  example_options o = tiny_options("auto");
  o.save_every = 2;
  EXPECT_TRUE(has(config_error_of(o), "--save-every 2 without --save")) << config_error_of(o);
  o.save_every = 0;
  o.save = dir.path() + "/missing/ck";
  EXPECT_TRUE(has(config_error_of(o), "--save: cannot make the folder '" + o.save + "'")) << config_error_of(o);
  o.save = dir.path() + "/new";  // made by the save
  EXPECT_EQ(config_error_of(o), "accepted");
  // The check makes an entry and removes it: nothing is left behind.
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    ADD_FAILURE() << "left behind: " << e.path();
  // A folder whose file system refuses new entries though access() says it may be written
  // (procfs, for root as for anyone; a root-squashed NFS export is the same case).
  if (std::filesystem::is_directory("/proc/self")) {
    o.save = "/proc/spillway-save-check";
    EXPECT_TRUE(has(config_error_of(o), "--save: cannot make the folder '/proc/spillway-save-check': '/proc' is not writable"))
        << config_error_of(o);
    o.save = "/proc";
    EXPECT_TRUE(has(config_error_of(o), "--save: the folder '/proc' is not writable")) << config_error_of(o);
  }
  o.save.clear();
  o.resume = dir.path();
  EXPECT_TRUE(has(config_error_of(o), "no checkpoint in '" + dir.path() + "'")) << config_error_of(o);

  example_options saver = tiny_options("auto");
  saver.steps = 2;
  saver.save = dir.path();
  (void)run_mlp(saver, {});
  o.resume = dir.path();
  o.steps = 2;
  EXPECT_TRUE(has(config_error_of(o), "leaves nothing to run; give --steps above 2")) << config_error_of(o);
  o.steps = 4;
  o.seed = 8;
  EXPECT_TRUE(has(config_error_of(o), "give --seed 7")) << config_error_of(o);
  o.seed = 7;
  // The model's shape settings: another one is refused by name, not at the load by a tensor's size.
  o.size = preset::small;
  EXPECT_TRUE(has(config_error_of(o), "the checkpoint is of a run with --preset tiny, this run has --preset small; give --preset tiny"))
      << config_error_of(o);
  o.size = preset::tiny;
  o.prec = precision::bf16;
  EXPECT_TRUE(has(config_error_of(o), "give --precision fp32")) << config_error_of(o);
  o.prec = precision::fp32;
  o.micro_batches = 2;
  EXPECT_TRUE(has(config_error_of(o), "give --micro-batches 1")) << config_error_of(o);
  o.micro_batches = 1;
  EXPECT_EQ(config_error_of(o), "accepted");
  try {  // a checkpoint of another model: its tensors are named in the refusal
    (void)run_gpt(o, {});
    FAIL() << "an mlp checkpoint loaded into the gpt";
  } catch (const config_error& e) {
    EXPECT_TRUE(has(e.what(), "has no tensor")) << e.what();
  }
}

// Note [Rank checkpoints]: a data-parallel job's checkpoint is a folder per rank; resuming it
// without --data-parallel, or a plain checkpoint with it, is refused before any work (no MPI
// starts here: the 2-rank save and resume are in test_data_parallel.cpp). With --micro-batches
// the checkpoint is plain and resumes to the whole run's losses.
TEST(ExamplesCheckpoint, RankFoldersAreCheckedAndMicroBatchesResume) {
  test::temp_dir dir;
  EXPECT_EQ(rank_folder("ck", 1, 2), "ck/rank-1-of-2");
  std::filesystem::create_directories(dir.path() + "/dp/rank-0-of-2");
  example_options o = tiny_options("auto");
  o.steps = 4;
  o.resume = dir.path() + "/dp";
  EXPECT_TRUE(has(config_error_of(o), "holds a checkpoint of a data-parallel job (rank-0-of-2)")) << config_error_of(o);
  o.data_parallel = true;
  o.resume = dir.path();
  EXPECT_TRUE(has(config_error_of(o), "holds no checkpoint of a data-parallel job")) << config_error_of(o);

  example_options mb = tiny_options("auto");
  mb.micro_batches = 2;
  mb.steps = 2;
  mb.save = dir.path() + "/mb";
  (void)run_mlp(mb, {});
  mb.save.clear();
  mb.resume = dir.path() + "/mb";
  mb.steps = 4;
  const run_result mb_resumed = run_mlp(mb, {});
  example_options mb_whole = tiny_options("auto");
  mb_whole.micro_batches = 2;
  mb_whole.steps = 4;
  const run_result mb_all = run_mlp(mb_whole, {});
  ASSERT_EQ(mb_resumed.losses.size(), 2u);
  EXPECT_EQ(mb_resumed.losses[0], mb_all.losses[2]);
  EXPECT_EQ(mb_resumed.losses[1], mb_all.losses[3]);
}

}  // namespace
}  // namespace spillway::examples
