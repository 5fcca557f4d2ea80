// Tests of the model zoo: every model yields a valid trace with forward, backward and Adam,
// and parameter counts match the published sizes.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "device/error.hpp"
#include "offload/lifetime.hpp"
#include "offload/zoo.hpp"

namespace spillway::offload {
namespace {

// Parameter elements: parameters are bf16 (2 B) in transformers, fp32 (4 B) in CNNs.
double params_of(const trace& t, double bytes_per) {
  double sum = 0;
  for (const auto& x : t.tensors)
    if (x.kind == tensor_kind::parameter) sum += static_cast<double>(x.bytes) / bytes_per;
  return sum;
}

TEST(Zoo, EveryModelIsAValidTrainingStep) {
  for (const auto& name : zoo_model_names()) {
    SCOPED_TRACE(name);
    zoo_options o;
    o.batch = 2;
    o.seq = name.rfind("gpt", 0) == 0 || name == "bert-large" ? 128 : 64;
    const auto t = make_model_trace(name, o);
    ASSERT_NO_THROW(t.validate());
    int phases[4] = {};
    for (const auto& op : t.ops) ++phases[static_cast<int>(op.phase)];
    EXPECT_GT(phases[0], 0);
    EXPECT_GT(phases[1], 0);
    EXPECT_GT(phases[2], 0);
    const auto r = analyze(t);
    EXPECT_GT(r.peak_live_bytes, r.persistent_bytes);
    EXPECT_GT(r.bytes_by_kind[static_cast<int>(tensor_kind::optimizer_state)], 0u);
    EXPECT_GT(r.total_flops, 0);
  }
  EXPECT_THROW(make_model_trace("alexnet"), config_error);
}

TEST(Zoo, OptimizerStepsComeInTheOrderGradientsAreDone) {
  // Each Adam step reads one gradient; the last device op writing it comes no earlier than the
  // last one writing the gradient of the step before (a host optimizer works in arrival order).
  for (const auto& name : zoo_model_names()) {
    SCOPED_TRACE(name);
    zoo_options o;
    o.batch = 2;
    o.seq = 64;
    const auto t = make_model_trace(name, o);
    const auto r = analyze(t);
    std::int64_t prev = -1;
    std::size_t steps = 0;
    for (op_index k = 0; k < t.ops.size(); ++k) {
      if (t.ops[k].name.rfind("adam.", 0) != 0) continue;
      ++steps;
      std::int64_t done = -1;
      for (tensor_id x : t.ops[k].reads)
        if (t.tensors[x].kind == tensor_kind::gradient)
          for (const auto& u : r.tensors[x].uses)
            if (u.writes && u.op != k) done = std::max<std::int64_t>(done, u.op);
      ASSERT_GE(done, 0) << t.ops[k].name;
      EXPECT_GE(done, prev) << t.ops[k].name;
      prev = done;
    }
    EXPECT_GT(steps, 1u);
  }
}

TEST(Zoo, ParameterCountsMatchPublishedSizes) {
  zoo_options o;
  o.batch = 1;
  o.seq = 1024;
  // wpe is seq x hidden: at seq 1024 GPT-2 small has 124.4M parameters.
  EXPECT_NEAR(params_of(make_model_trace("gpt2-small", o), 2) / 1e6, 124.4, 1.0);
  EXPECT_NEAR(params_of(make_model_trace("gpt2-xl", o), 2) / 1e9, 1.56, 0.02);
  o.seq = 2048;
  EXPECT_NEAR(params_of(make_model_trace("gpt3-6.7b", o), 2) / 1e9, 6.7, 0.1);
  EXPECT_NEAR(params_of(make_model_trace("gpt3-13b", o), 2) / 1e9, 12.9, 0.2);
  o.seq = 224;
  EXPECT_NEAR(params_of(make_model_trace("resnet50", o), 4) / 1e6, 25.5, 0.3);
  EXPECT_NEAR(params_of(make_model_trace("vgg16", o), 4) / 1e6, 138.4, 0.5);
  EXPECT_NEAR(params_of(make_model_trace("resnet152", o), 4) / 1e6, 60.2, 0.5);
}

const op_desc* find_op(const trace& t, const std::string& name) {
  for (const auto& op : t.ops)
    if (op.name == name) return &op;
  return nullptr;
}

bool touches(const op_desc& op, tensor_id x, bool write) {
  const auto& v = write ? op.writes : op.reads;
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST(Zoo, AddsHandTheirGradientToBothInputs) {
  // Note [Adds pass their gradient on]: a residual add writes no gradient; its branch reads the
  // add's output gradient, and the block's first op adds the skip path's share into it.
  zoo_options o;
  o.batch = 2;
  o.seq = 64;
  const auto t = make_model_trace("resnet50", o);
  tensor_id g = 0;
  bool found = false;
  for (tensor_id x = 0; x < t.tensors.size(); ++x)
    if (t.tensors[x].name == "d.layer1.1.add.out") g = x, found = true;
  ASSERT_TRUE(found);
  EXPECT_EQ(find_op(t, "layer1.1.add.bwd"), nullptr);
  for (const auto& x : t.tensors) EXPECT_NE(x.name, "d.layer1.1.bn3.out");  // no gradient of its own
  const auto* relu = find_op(t, "layer1.1.relu3.bwd");
  const auto* bn3 = find_op(t, "layer1.1.bn3.bwd");
  const auto* conv1 = find_op(t, "layer1.1.conv1.bwd");
  ASSERT_TRUE(relu && bn3 && conv1);
  EXPECT_TRUE(touches(*relu, g, true));
  EXPECT_TRUE(touches(*bn3, g, false));
  EXPECT_FALSE(touches(*bn3, g, true));
  EXPECT_TRUE(touches(*conv1, g, false));
  EXPECT_TRUE(touches(*conv1, g, true));  // the skip path's share added in
  EXPECT_LT(bn3, conv1);                  // after the branch has read it
  // The block's input gradient is that same tensor: the previous block's relu3 reads it.
  const auto* prev = find_op(t, "layer1.0.relu3.bwd");
  ASSERT_NE(prev, nullptr);
  EXPECT_TRUE(touches(*prev, g, false));
  // The downsampling block's add hands its gradient to both of its branches as well.
  const auto* down = find_op(t, "layer1.0.down.bn.bwd");
  const auto* bn3_0 = find_op(t, "layer1.0.bn3.bwd");
  ASSERT_TRUE(down && bn3_0);
  EXPECT_EQ(down->reads.front(), bn3_0->reads.front());
  // The transformers' residual adds likewise.
  const auto gpt = make_model_trace("gpt2-small", o);
  EXPECT_EQ(find_op(gpt, "h0.add1.bwd"), nullptr);
  EXPECT_EQ(find_op(gpt, "h0.add2.bwd"), nullptr);
}

TEST(Zoo, FlopsScaleWithBatchAndLayersOverride) {
  zoo_options a{2, 128, 2}, b{4, 128, 2}, c{2, 128, 4};
  const auto ta = make_model_trace("gpt2-small", a), tb = make_model_trace("gpt2-small", b);
  const auto tc = make_model_trace("gpt2-small", c);
  EXPECT_NEAR(analyze(tb).total_flops / analyze(ta).total_flops, 2.0, 0.05);
  EXPECT_GT(tc.ops.size(), ta.ops.size());
}

// The message of the config_error that making `name` at `o` throws; empty when it builds.
std::string error_of(const std::string& name, const zoo_options& o) {
  try {
    (void)make_model_trace(name, o);
  } catch (const config_error& e) {
    return e.what();
  }
  return {};
}

TEST(Zoo, ShapesNoModelCanTakeAreRefusedWithTheLeastThatWorks) {
  // A CNN's image side must leave each pooling window a map to slide over: VGG-16 halves it
  // five times, ResNet pools 3x3 after a stride-2 conv. The least side builds; one less is
  // refused before anything is built, with the least in the message.
  for (const auto& [name, least] : {std::pair<std::string, std::uint32_t>{"vgg16", 32}, {"resnet50", 5}, {"resnet152", 5}}) {
    SCOPED_TRACE(name);
    zoo_options o;
    o.batch = 1;
    o.seq = least;
    EXPECT_EQ(error_of(name, o), "");
    EXPECT_NO_THROW(make_model_trace(name, o).validate());
    o.seq = least - 1;
    const auto msg = error_of(name, o);
    EXPECT_NE(msg.find("image side of " + std::to_string(least - 1)), std::string::npos) << msg;
    EXPECT_NE(msg.find("at least " + std::to_string(least)), std::string::npos) << msg;
    o.seq = 100'000'000;  // a first conv output past a petabyte
    EXPECT_NE(error_of(name, o).find("past a petabyte"), std::string::npos);
  }
  zoo_options o;
  o.heads = 5;  // 768 is not a multiple of 5
  EXPECT_NE(error_of("gpt2-small", o).find("do not divide the hidden size 768"), std::string::npos);
  o = {};
  o.batch = 100'000'000;
  EXPECT_NE(error_of("gpt2-small", o).find("past a petabyte"), std::string::npos);
  o = {};
  o.layers = 2;  // a transformer's shape on a CNN
  EXPECT_NE(error_of("resnet50", o).find("keeps its published layers"), std::string::npos);
}

}  // namespace
}  // namespace spillway::offload
