// README.md's C++ blocks, extracted by extract_readme.py and compiled against the public header
// alone (Note [README blocks]): here they run, with small stand-ins, on the device `auto` finds
// (the cpu backend where no GPU answers), and what they leave behind is checked.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "readme_stand_ins.hpp"

namespace {

/// The stand-ins of a run of 3 steps of a 16 x 16 linear layer on a batch of 4, and a GEMM that
/// counts its calls and checks what it is handed (the README leaves the GEMM to the reader).
struct rig {
  std::vector<float> weight = std::vector<float>(16 * 16, 0.5f);
  std::vector<float> batch = std::vector<float>(4 * 16, 1.0f);
  int gemm_calls = 0;
  std::vector<std::string> gemm_problems;

  readme::stand_ins stand_ins() {
    readme::stand_ins in;
    in.w_bytes = weight.size() * sizeof(float);
    in.x_bytes = batch.size() * sizeof(float);
    in.y_bytes = 4 * 16 * sizeof(float);
    in.w_init = weight.data();
    in.batch = batch.data();
    in.steps = 3;
    in.my_gemm = [this](const float* x, const float* w, float* y, spillway::stream) {
      ++gemm_calls;
      if (x == nullptr || w == nullptr || y == nullptr) gemm_problems.push_back("a null pointer");
      if (x == w || x == y || w == y) gemm_problems.push_back("two tensors at one address");
    };
    return in;
  }
};

TEST(Readme, HasCodeBlocksThatNameTheirLines) {
  ASSERT_FALSE(readme::blocks.empty());
  for (const auto& b : readme::blocks) {
    EXPECT_EQ(std::string(b.where).rfind("README.md:", 0), 0u) << b.where;
    EXPECT_NE(b.run, nullptr) << b.where;
  }
}

TEST(Readme, TheTrainingLoopRunsAndIsPlannedAfterItsFirstIteration) {
  // The block asks for a 6 GiB budget; the cpu backend's emulated device must hold it. The
  // memory is reserved, not touched: unless malloc fills it, as it does under meson test, which
  // sets MALLOC_PERTURB_ (6 GiB written twice). Turned off here; the test reads no fresh memory.
  ASSERT_EQ(::setenv("SPILLWAY_CPU_DEVICE_MEMORY", "8GiB", 1), 0);
  ::mallopt(M_PERTURB, 0);
  int sessions = 0, loops = 0, flat_loops = 0, host_loops = 0;
  for (const auto& b : readme::blocks) {
    rig r;
    const readme::outcome out = b.run(r.stand_ins());
    if (!out.made_session) continue;
    ++sessions;
    SCOPED_TRACE(b.where);
    ASSERT_EQ(out.history.size(), 3u);
    EXPECT_FALSE(out.history[0].planned);  // iteration 1 records
    for (std::size_t i = 1; i < out.history.size(); ++i) {
      EXPECT_TRUE(out.history[i].planned) << "iteration " << i + 1;
      EXPECT_EQ(out.history[i].iteration, i + 1);
    }
    std::vector<std::string> ops;
    for (const auto& op : out.recorded.ops) ops.push_back(op.name);
    std::set<std::string> tensors;
    for (const auto& t : out.recorded.tensors) tensors.insert(t.name);
    ASSERT_FALSE(ops.empty());
    if (ops.front() == "load batch") {  // the training loop
      ++loops;
      EXPECT_EQ(r.gemm_calls, 6);  // forward and backward, 3 steps
      EXPECT_TRUE(r.gemm_problems.empty()) << r.gemm_problems.front();
      for (const auto& h : out.history) EXPECT_EQ(h.policy, h.planned ? "auto" : "on-demand");
      EXPECT_EQ(ops, (std::vector<std::string>{"load batch", "fc.forward", "fc.backward", "sgd"}));
      for (const char* name : {"fc.weight", "fc.weight.grad", "x", "fc.out"}) EXPECT_TRUE(tensors.contains(name)) << name;
    } else if (ops.front() == "fc.backward") {  // the loop with a host-capable step, run on the host
      ++host_loops;
      EXPECT_EQ(ops, (std::vector<std::string>{"fc.backward", "sgd"}));
      EXPECT_TRUE(out.recorded.ops.back().host_capable);
      EXPECT_TRUE(tensors.contains("w.momentum"));
      EXPECT_EQ(out.history[0].host_ops, 0u);  // recorded on the device
      for (std::size_t i = 1; i < out.history.size(); ++i) EXPECT_EQ(out.history[i].host_ops, 1u) << "iteration " << i + 1;
    } else {  // the flat-buffer loop: its ops name the views, and the optimizer every piece
      ++flat_loops;
      for (const char* name : {"w0", "w3", "grads[0:1024]", "y2"}) EXPECT_TRUE(tensors.contains(name)) << name;
      ASSERT_EQ(ops.size(), 4u * 2u + 1u);
      EXPECT_EQ(ops.back(), "sgd");
      EXPECT_EQ(out.recorded.ops.back().reads.size(), 8u) << "sgd over the flat buffers reads every view";
    }
  }
  EXPECT_GE(sessions, 3) << "README blocks that open a spillway::Session";
  EXPECT_EQ(loops, 1) << "the training loop block";
  EXPECT_EQ(flat_loops, 1) << "the flat-buffer block";
  EXPECT_EQ(host_loops, 1) << "the host_capable_op block";
}

}  // namespace
