// The examples' global-norm gradient clipping (--clip-grad-norm): it really clips at a small
// norm, its ops come in registration order before any Adam op, the losses are bit for bit the
// same under every policy and budget as with everything resident, and a bad value is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/report.hpp"
#include "examples/gpt/gpt_model.hpp"
#include "examples/mlp/mlp_model.hpp"
#include "example_runs.hpp"

namespace spillway::examples {
namespace {


constexpr int steps = testing::tiny_steps;
/// Far below the tiny models' gradient norms, so every step clips.
constexpr double small_norm = 0.05;

using testing::losses_text;

run_result run(const std::string& example, const example_options& o) { return testing::run_example(example, o); }

model_factory factory(const std::string& example, const example_options& o) { return testing::factory_for(example, o); }

/// The tiny options with clipping at `clip` (0: off).
example_options tiny_options(const std::string& policy, std::uint64_t budget, double clip) {
  example_options o = testing::tiny_options(policy, budget);
  o.clip_grad_norm = clip;
  return o;
}

/// The global norm of the gradients a run's Session holds now (after a step), in float64.
double gradient_norm(training_run& r) {
  double sum = 0;
  const trace& t = r.session().recorded_trace();
  for (std::size_t id = 0; id < t.tensors.size(); ++id) {
    if (t.tensors[id].kind != tensor_kind::gradient) continue;
    std::vector<float> g(t.tensors[id].bytes / sizeof(float));
    r.session().read(tensor_handle{static_cast<tensor_id>(id)}, g.data(), t.tensors[id].bytes);
    for (float v : g) sum += static_cast<double>(v) * v;
  }
  return std::sqrt(sum);
}

/// The everything-resident run of each example with clipping at small_norm, made once.
const run_result& resident_clipped(const std::string& example) {
  static std::map<std::string, run_result> cache;
  auto it = cache.find(example);
  if (it == cache.end()) it = cache.emplace(example, run(example, tiny_options("none", 0, small_norm))).first;
  return it->second;
}

class clip_examples : public ::testing::TestWithParam<std::string> {};

TEST_P(clip_examples, a_small_norm_changes_the_losses_after_the_first_step) {
  const run_result& clipped = resident_clipped(GetParam());
  const run_result plain = run(GetParam(), tiny_options("none", 0, 0));
  ASSERT_EQ(clipped.losses.size(), plain.losses.size());
  // The first loss is taken before any update. Adam's first step hardly sees a scale common to
  // all gradients, but the second sees two steps clipped by different factors: its loss moves.
  EXPECT_EQ(std::bit_cast<std::uint32_t>(clipped.losses[0]), std::bit_cast<std::uint32_t>(plain.losses[0]));
  EXPECT_NE(std::bit_cast<std::uint32_t>(clipped.losses[2]), std::bit_cast<std::uint32_t>(plain.losses[2]))
      << "clipping changed nothing: " << losses_text(clipped) << "vs " << losses_text(plain);
  for (float l : clipped.losses) EXPECT_TRUE(std::isfinite(l));
  // A norm far above the gradients' leaves every gradient as it was: the losses of no clipping.
  EXPECT_EQ(losses_text(run(GetParam(), tiny_options("none", 0, 1e30))), losses_text(plain));
}

TEST_P(clip_examples, norm_ops_then_clip_ops_in_registration_order_before_any_adam_op) {
  const auto o = tiny_options("none", 0, small_norm);
  training_run r(o, factory(GetParam(), o));
  (void)r.step();
  const trace& t = r.session().recorded_trace();
  std::vector<std::string> norms, clips;
  std::size_t first_adam = t.ops.size(), last_clip = 0, first_norm = t.ops.size();
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const std::string& n = t.ops[i].name;
    auto ends = [&](const std::string& tail) {
      return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends(".optim.norm")) {
      norms.push_back(n.substr(0, n.size() - 11));
      first_norm = std::min(first_norm, i);
      EXPECT_TRUE(clips.empty()) << n << " after a clip op";
      EXPECT_EQ(t.ops[i].phase, op_phase::optimizer) << n;
    }
    if (ends(".optim.clip")) {
      clips.push_back(n.substr(0, n.size() - 11));
      last_clip = i;
    }
    if (n.find(".adam") != std::string::npos) first_adam = std::min(first_adam, i);
  }
  ASSERT_FALSE(norms.empty());
  EXPECT_EQ(norms, clips) << "one clip op per norm op, in the same order";
  EXPECT_LT(last_clip, first_adam) << "a clip op after an Adam op";
  // In registration order: the order of the parameters' gradient tensors.
  std::vector<std::string> registered;
  for (const auto& d : t.tensors)
    if (d.kind == tensor_kind::gradient) registered.push_back(d.name.substr(0, d.name.size() - 5));  // less ".grad"
  EXPECT_EQ(norms, registered);
  EXPECT_LT(first_norm, t.ops.size());
  // The gradients Adam read were clipped: their norm is the max norm (less the 1e-6).
  EXPECT_NEAR(gradient_norm(r), small_norm, 1e-5 * small_norm);
  // Clipping off: no such ops, and gradients well above the max norm, so the test above clipped.
  const auto off = tiny_options("none", 0, 0);
  training_run plain(off, factory(GetParam(), off));
  (void)plain.step();
  for (const auto& op : plain.session().recorded_trace().ops)
    EXPECT_EQ(op.name.find(".optim."), std::string::npos) << op.name;
  EXPECT_GT(gradient_norm(plain), 4 * small_norm);
}

// Note [Updates in the backward pass]: without clipping, each parameter's Adam ops run inside the
// backward pass, after every op that writes its gradient, and no later op but its own other
// chunks' reads or writes what they touch. (That the losses stay those of updates after the pass
// is the 1e30 comparison above: clipping at any norm updates after the pass.)
TEST_P(clip_examples, without_clipping_each_update_runs_in_the_backward_pass_once_its_gradient_is_final) {
  const auto o = tiny_options("none", 0, 0);
  training_run r(o, factory(GetParam(), o));
  (void)r.step();
  const trace& t = r.session().recorded_trace();
  std::size_t last_backward = 0, first_adam = t.ops.size(), adam_ops = 0;
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    if (t.ops[i].phase == op_phase::backward) last_backward = i;
    const std::string& n = t.ops[i].name;
    const auto at = n.find(".adam");
    if (at == std::string::npos) continue;
    ++adam_ops;
    first_adam = std::min(first_adam, i);
    const std::string own = n.substr(0, at) + ".adam";  // this parameter's Adam ops
    std::vector<tensor_id> touched = t.ops[i].reads;
    touched.insert(touched.end(), t.ops[i].writes.begin(), t.ops[i].writes.end());
    for (std::size_t j = i + 1; j < t.ops.size(); ++j) {
      if (t.ops[j].name.rfind(own, 0) == 0) continue;
      for (tensor_id x : touched) {
        const auto& later = t.ops[j];
        const bool uses = std::find(later.reads.begin(), later.reads.end(), x) != later.reads.end() ||
                          std::find(later.writes.begin(), later.writes.end(), x) != later.writes.end();
        EXPECT_FALSE(uses) << n << " (op " << i << ") runs before op " << j << " '" << later.name << "', which uses '"
                           << t.tensors[x].name << "'";
      }
    }
  }
  EXPECT_GT(adam_ops, 0u);
  EXPECT_LT(first_adam, last_backward) << "every update after the backward pass";
}

// Updates the plan runs on the host come after the backward pass: from the start with host_ops
// "host", and with "auto" from the step whose plan first puts one there (recorded again once).
TEST_P(clip_examples, updates_placed_on_the_host_run_after_the_backward_pass) {
  auto first_update_after_last_backward = [](const trace& t) {
    std::size_t last_backward = 0, first_adam = t.ops.size();
    for (std::size_t i = 0; i < t.ops.size(); ++i) {
      if (t.ops[i].phase == op_phase::backward) last_backward = i;
      if (t.ops[i].name.find(".adam") != std::string::npos) first_adam = std::min(first_adam, i);
    }
    return first_adam < t.ops.size() && first_adam > last_backward;
  };
  auto host = tiny_options("auto", 0, 0);
  host.host_ops = "host";
  training_run h(host, factory(GetParam(), host));
  (void)h.step();
  EXPECT_TRUE(first_update_after_last_backward(h.session().recorded_trace()));

  // auto on the cpu backend at half the footprint: its plans run updates on the host.
  const run_result& base = resident_clipped(GetParam());
  auto o = tiny_options("auto", base.footprint_bytes / 2, 0);
  training_run a(o, factory(GetParam(), o));
  (void)a.step();
  EXPECT_FALSE(first_update_after_last_backward(a.session().recorded_trace())) << "the recording updates in the pass";
  (void)a.step();
  (void)a.step();
  ASSERT_NE(a.session().current_plan(), nullptr);
  if (a.session().current_plan()->host_op_count() > 0) {  // so here: 28, 18 and 30 host ops (a host slower than that could keep them)
    EXPECT_FALSE(a.result().iterations[1].planned) << "step 2 moved its updates without recording again";
    EXPECT_TRUE(first_update_after_last_backward(a.session().recorded_trace()));
    EXPECT_TRUE(a.result().iterations[2].planned);
  }
}

INSTANTIATE_TEST_SUITE_P(examples, clip_examples, ::testing::Values("gpt", "mlp", "cnn"));

class clip_invariant : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(clip_invariant, losses_match_everything_resident) {
  const auto& [example, policy, budget_name] = GetParam();
  const run_result& base = resident_clipped(example);
  ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(steps));
  const std::uint64_t budget = budget_name == "half" ? base.footprint_bytes / 2 : base.min_budget_bytes;
  ASSERT_LT(base.min_budget_bytes, base.footprint_bytes / 2);
  const run_result r = run(example, tiny_options(policy, budget, small_norm));
  EXPECT_EQ(r.device_budget_bytes, budget);
  ASSERT_EQ(r.losses.size(), base.losses.size());
  for (std::size_t i = 0; i < r.losses.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(r.losses[i]), std::bit_cast<std::uint32_t>(base.losses[i]))
        << example << " step " << i << ": " << losses_text(r) << "vs resident " << losses_text(base);
  EXPECT_LE(r.peak_device_bytes, budget);
  EXPECT_GT(r.h2d_bytes + r.d2h_bytes + r.recomputes, 0u) << "nothing left the device: the budget tested nothing";
}

std::string setting_name(const ::testing::TestParamInfo<clip_invariant::ParamType>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
}

INSTANTIATE_TEST_SUITE_P(examples, clip_invariant,
                         ::testing::Combine(::testing::Values("gpt", "mlp"), ::testing::Values("lms", "vdnn", "auto"),
                                            ::testing::Values("half", "least")),
                         setting_name);
// cnn at two settings only, to keep the suite short.
INSTANTIATE_TEST_SUITE_P(cnn, clip_invariant,
                         ::testing::Values(std::make_tuple("cnn", "lms", "half"),
                                           std::make_tuple("cnn", "auto", "least")),
                         setting_name);

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

std::string validate_error(double clip) {
  auto o = tiny_options("none", 0, clip);
  try {
    o.validate();
  } catch (const config_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(clip_grad_norm_option, is_off_by_default_and_read_from_its_flag) {
  EXPECT_EQ(example_options{}.clip_grad_norm, 0.0);
  EXPECT_EQ(load({}).clip_grad_norm, 0.0);
  EXPECT_EQ(load({"--clip-grad-norm", "1.5"}).clip_grad_norm, 1.5);
  EXPECT_EQ(load({"--clip-grad-norm", "0"}).clip_grad_norm, 0.0);
}

TEST(clip_grad_norm_option, negative_nan_infinite_and_unrepresentable_values_are_refused_naming_the_flag) {
  for (double bad : {-1.0, -1e-9, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                     1e300, 1e-300}) {
    const std::string msg = validate_error(bad);
    EXPECT_EQ(msg.rfind("--clip-grad-norm: ", 0), 0u) << bad << ": " << msg;
    EXPECT_NE(msg.find("or 0 for no clipping"), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_EQ(validate_error(1e-3), "no error");
  // From the command line too, before any work.
  try {
    (void)load({"--clip-grad-norm=-2"});
    ADD_FAILURE() << "no error for --clip-grad-norm=-2";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("--clip-grad-norm: -2 is not a norm"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)run_mlp(tiny_options("none", 0, -1)), config_error);
}

}  // namespace
}  // namespace spillway::examples
