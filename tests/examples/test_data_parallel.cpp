// Data parallel across ranks (--data-parallel), run under mpirun -np 2: each example, in fp32 and
// bf16, with ZeRO stage 2 under every policy and stage 1 under none and auto (each but none at a
// per-rank budget of 1/4 of the one-process footprint), trains to the losses of one process with --micro-batches 2, bit for
// bit, and again on a second run (Note [Micro-batches]). Every rank runs the same runs in the same
// order (their collectives meet) and checks its own losses; the single-process references are
// computed by each rank alone.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "comm/communicator.hpp"
#include "examples/common/report.hpp"
#include "example_runs.hpp"

namespace spillway::examples {
namespace {

using testing::losses_text;

example_options options(const std::string& policy, std::uint64_t budget, precision p) {
  example_options o = testing::tiny_options(policy, budget);
  o.prec = p;
  return o;
}

TEST(data_parallel, ranks_give_the_losses_of_one_process_with_as_many_micro_batches) {
  const auto world = comm::communicator::world();
  if (world->size() < 2) GTEST_SKIP() << "run under mpirun -np 2 (a world of " << world->size() << ")";
  const int ranks = world->size();
  int runs = 0;
  for (const char* example : {"gpt", "mlp", "cnn"}) {
    for (const precision prec : {precision::fp32, precision::bf16}) {
      const run_result whole = testing::run_example(example, options("none", 0, prec));
      example_options ref_o = options("none", 0, prec);
      ref_o.micro_batches = ranks;
      const run_result ref = testing::run_example(example, ref_o);
      for (const int zero : {1, 2}) {
        for (const char* policy : {"none", "lms", "vdnn", "auto", "checkpoint", "capuchin", "zero-offload"}) {
          if (zero == 1 && std::string(policy) != "none" && std::string(policy) != "auto") continue;  // stage 2 takes them all
          example_options o = options(policy, 0, prec);
          o.data_parallel = true;
          o.zero = zero;
          const bool quarter = std::string(policy) != "none";
          if (quarter) o.device_budget = whole.footprint_bytes / 4;  // per rank: 1/4 of one process's footprint
          const run_result r = testing::run_example(example, o);
          ++runs;
          EXPECT_EQ(losses_text(r), losses_text(ref))
              << example << " zero " << zero << " " << policy << " rank " << world->rank();
          // Every model hands each gradient over in its backward pass (none is left for after it).
          EXPECT_EQ(r.exchange.staged_after, 0u) << example << " " << policy;
          EXPECT_GT(r.exchange.staged_in_backward, 0u) << example << " " << policy;
          // vdnn offloads what its rule says, whatever the budget (the simulator calls such plans infeasible).
          if (quarter && std::string(policy) != "vdnn") {
            EXPECT_LE(r.peak_device_bytes, o.device_budget) << example << " " << policy;
          }
        }
      }
      example_options again = options("lms", 0, prec);
      again.data_parallel = true;
      EXPECT_EQ(losses_text(testing::run_example(example, again)), losses_text(ref)) << example << " run again";
    }
  }
  EXPECT_EQ(runs, 3 * 2 * (2 + 7));
}

// Note [Rank checkpoints]: every rank saves its shard in a folder of its own; the job resumed on
// as many ranks gives the uninterrupted run's losses, bit for bit.
TEST(data_parallel, a_saved_job_resumes_to_the_whole_runs_losses) {
  const auto world = comm::communicator::world();
  if (world->size() < 2) GTEST_SKIP() << "run under mpirun -np 2 (a world of " << world->size() << ")";
  // One folder for the job: rank 0 makes it and tells the others.
  std::array<char, 256> path{};
  if (world->rank() == 0) {
    std::string t = ::testing::TempDir() + "spillway-dp-XXXXXX";
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    std::snprintf(path.data(), path.size(), "%s", t.c_str());
  }
  world->broadcast(path.data(), path.size(), 0);
  const std::string dir(path.data());
  for (const precision prec : {precision::fp32, precision::bf16}) {
    example_options o = options("auto", 0, prec);
    o.data_parallel = true;
    o.steps = 4;
    const run_result whole = testing::run_example("gpt", o);
    example_options first = o;
    first.steps = 2;
    first.save = dir + "/" + to_string(prec);
    (void)testing::run_example("gpt", first);
    world->barrier();  // every rank's folder is there
    EXPECT_TRUE(std::filesystem::is_directory(rank_folder(first.save, world->rank(), world->size())));
    example_options rest = o;
    rest.resume = first.save;
    const run_result resumed = testing::run_example("gpt", rest);
    ASSERT_EQ(resumed.losses.size(), 2u);
    EXPECT_EQ(format_loss(resumed.losses[0]), format_loss(whole.losses[2])) << to_string(prec);
    EXPECT_EQ(format_loss(resumed.losses[1]), format_loss(whole.losses[3])) << to_string(prec);
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

// Note [Overlapped gradient exchange]: with small buckets, every step queues several buckets
// while its backward pass still runs (all but the last of each step), and the losses stay those
// of one process with as many micro-batches, in either ZeRO stage.
TEST(data_parallel, buckets_are_reduced_while_the_backward_pass_runs) {
  const auto world = comm::communicator::world();
  if (world->size() < 2) GTEST_SKIP() << "run under mpirun -np 2 (a world of " << world->size() << ")";
  for (const char* example : {"gpt", "mlp", "cnn"}) {
    for (const precision prec : {precision::fp32, precision::bf16}) {
      example_options ref_o = options("none", 0, prec);
      ref_o.micro_batches = world->size();
      const run_result ref = testing::run_example(example, ref_o);
      for (const int zero : {1, 2}) {
        example_options o = options("auto", 0, prec);
        o.data_parallel = true;
        o.zero = zero;
        o.bucket_bytes = 1024;
        const run_result r = testing::run_example(example, o);
        EXPECT_EQ(losses_text(r), losses_text(ref)) << example << " zero " << zero;
        const auto steps = static_cast<std::uint64_t>(testing::tiny_steps);
        const auto& x = r.exchange;
        EXPECT_GE(x.buckets, 3 * steps) << example;
        EXPECT_GE(x.buckets_in_backward + steps, x.buckets) << example << ": only each step's last bucket may wait for the pass's end";
        EXPECT_EQ(x.staged_after, 0u) << example;
        EXPECT_EQ(x.staged_in_backward % steps, 0u) << example;
      }
    }
  }
}

}  // namespace
}  // namespace spillway::examples
