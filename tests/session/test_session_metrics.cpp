// Values past the end of the step. Metrics read after it (Note [Metrics after the step] in
// offload/session_ops.cpp): a loop that prints its loss after end_iteration() reads the
// iteration's last value of each metric it did not release, until the next begin_iteration();
// other transients, released metrics and metrics no op wrote are refused with how to read them.
// A state handed to the next step in a transient is refused with where it belongs. Integer arithmetic, checked step by step
// against a host model of the same loop, at every policy and a tight budget.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "offload/swap_policy.hpp"
#include "loop_config.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using spillway::testing::config_for;

namespace {

constexpr int layers = 8;
constexpr std::size_t words = 4096;  // 16 KiB per tensor
constexpr std::size_t loss_words = 8;
constexpr std::size_t micro_batches = 3;
using words_t = std::vector<std::uint32_t>;

/// The loop's forward, backward and update, on the host: per micro-batch a loss of loss_words
/// words, summed over the micro-batches of a step into `sum`.
struct model {
  std::vector<words_t> w = std::vector<words_t>(layers, words_t(words));
  words_t last_loss = words_t(loss_words), sum = words_t(loss_words);

  explicit model(std::uint32_t seed) {
    for (int l = 0; l < layers; ++l)
      for (std::size_t i = 0; i < words; ++i) w[l][i] = (seed + static_cast<std::uint32_t>(l * words + i)) * 40503u;
  }
  static void layer(const std::uint32_t* in, const std::uint32_t* w, std::uint32_t* out, std::uint32_t x) {
    for (std::size_t i = 0; i < words; ++i) out[i] = ((in == nullptr ? x + static_cast<std::uint32_t>(i) : in[i]) * 2654435761u) ^ w[i];
  }
  static void loss(const std::uint32_t* a, std::uint32_t* out) {
    for (std::size_t j = 0; j < loss_words; ++j) out[j] = 0;
    for (std::size_t i = 0; i < words; ++i) out[i % loss_words] += a[i] >> 3;
  }
  static void update(const std::uint32_t* a, std::uint32_t* w) {
    for (std::size_t i = 0; i < words; ++i) w[i] += a[i] >> 9;
  }
  void step(int it) {
    sum.assign(loss_words, 0);
    std::vector<words_t> a(layers, words_t(words));
    for (std::size_t m = 0; m < micro_batches; ++m) {
      for (int l = 0; l < layers; ++l)
        layer(l == 0 ? nullptr : a[l - 1].data(), w[l].data(), a[l].data(), static_cast<std::uint32_t>(it * 7 + m));
      loss(a[layers - 1].data(), last_loss.data());
      for (std::size_t j = 0; j < loss_words; ++j) sum[j] += last_loss[j];
    }
    for (int l = layers - 1; l >= 0; --l) update(a[l].data(), w[l].data());  // the last micro-batch's
  }
};

/// The same loop through a Session: `loss` (the last micro-batch's) and `sum` (accumulated over
/// the micro-batches) are metrics it never releases; `act` is each layer's output, released only
/// when `release_acts`.
class loop {
 public:
  loop(Session& s, const model& init) : s_(s) {
    for (int l = 0; l < layers; ++l)
      w_.push_back(s.add_persistent("w" + std::to_string(l), words * 4, tensor_kind::parameter, init.w[l].data()));
  }
  void step(int it) {
    s_.begin_iteration();
    loss_ = s_.add_transient("loss", loss_words * 4, tensor_kind::metric);
    sum_ = s_.add_transient("loss.sum", loss_words * 4, tensor_kind::metric);
    std::vector<tensor_handle> a;
    for (std::size_t m = 0; m < micro_batches; ++m) {
      if (m > 0)
        for (auto t : a) s_.release(t);
      a.clear();
      for (int l = 0; l < layers; ++l) {
        a.push_back(s_.add_transient("a" + std::to_string(l), words * 4));
        std::vector<tensor_handle> reads{w_[l]};
        if (l > 0) reads.push_back(a[l - 1]);
        const std::vector<tensor_handle> writes{a[l]};
        auto op = s_.op("l" + std::to_string(l) + ".forward", reads, writes);
        op.run([&](const host_access& h) {
          model::layer(l == 0 ? nullptr : h.ptr<std::uint32_t>(a[l - 1]), h.ptr<std::uint32_t>(w_[l]),
                       h.ptr<std::uint32_t>(a[l]), static_cast<std::uint32_t>(it * 7 + m));
        });
      }
      auto op = s_.op("loss.forward", {a.back()}, {loss_}, {sum_});
      op.run([&](const host_access& h) {
        model::loss(h.ptr<std::uint32_t>(a.back()), h.ptr<std::uint32_t>(loss_));
        for (std::size_t j = 0; j < loss_words; ++j) h.ptr<std::uint32_t>(sum_)[j] += h.ptr<std::uint32_t>(loss_)[j];
      });
    }
    for (int l = layers - 1; l >= 0; --l) {
      auto op = s_.op("l" + std::to_string(l) + ".update", {a[l], w_[l]}, {w_[l]});
      op.run([&](const host_access& h) { model::update(h.ptr<std::uint32_t>(a[l]), h.ptr<std::uint32_t>(w_[l])); });
    }
    for (auto t : a) s_.release(t);
    act_ = a.back();
    (void)s_.end_iteration();
  }
  [[nodiscard]] words_t read(tensor_handle t, std::size_t n = loss_words) const {
    words_t v(n);
    s_.read(t, v.data(), n * 4);
    return v;
  }
  Session& s_;
  std::vector<tensor_handle> w_;
  tensor_handle loss_{}, sum_{}, act_{};
};

template <class F>
std::string usage_message(F&& f) {
  try {
    f();
  } catch (const usage_error& e) {
    return e.what();
  }
  return "no usage_error";
}

}  // namespace

// Every step's metrics, read after end_iteration() (twice: a read does not use them up), are the
// host model's, at every policy and at half and a quarter of the footprint.
TEST(SessionMetrics, EveryStepsMetricsAreReadAfterItsEnd) {
  const std::uint64_t seed = spillway::test::test_seed(43);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  for (const char* policy : {"none", "lms", "vdnn", "auto", "checkpoint", "capuchin"}) {
    for (const double ratio : {0.0, 0.5, 0.25}) {
      if (std::string(policy) == "none" && ratio > 0) continue;
      SCOPED_TRACE(std::string(policy) + " at " + std::to_string(ratio) + ", seed " + std::to_string(seed));
      model host(static_cast<std::uint32_t>(rng()));
      Session s(config_for(policy, ratio));
      loop l(s, host);
      for (int it = 1; it <= 5; ++it) {
        host.step(it);
        l.step(it);
        ASSERT_EQ(l.read(l.loss_), host.last_loss) << "step " << it;
        ASSERT_EQ(l.read(l.sum_), host.sum) << "step " << it;
        ASSERT_EQ(l.read(l.loss_), host.last_loss) << "step " << it << ", read again";
      }
      for (int k = 0; k < layers; ++k) {
        words_t w(words);
        s.read(l.w_[k], w.data(), words * 4);
        ASSERT_EQ(w, host.w[k]) << "layer " << k;
      }
    }
  }
}

// What is not kept is refused with how to read it: an activation, a released metric, a metric no
// op wrote, and last step's metric once the next step has begun.
TEST(SessionMetrics, WhatIsNotKeptIsRefusedWithHowToReadIt) {
  model host(7);
  Session s(config_for("auto", 0.5));
  loop l(s, host);
  l.step(1);
  const std::string act = usage_message([&] { (void)l.read(l.act_, words); });
  EXPECT_NE(act.find("read(\"a7\") between iterations"), std::string::npos) << act;
  EXPECT_NE(act.find("tensor_kind::metric"), std::string::npos) << act;

  s.begin_iteration();
  auto released = s.add_transient("released", loss_words * 4, tensor_kind::metric);
  auto unwritten = s.add_transient("unwritten", loss_words * 4, tensor_kind::metric);
  {
    auto op = s.op("metric.forward", {l.w_[0]}, {released});
    op.run([&](const host_access& h) { h.ptr<std::uint32_t>(released)[0] = 5; });
  }
  s.release(released);
  const std::string stale = usage_message([&] { (void)l.read(l.loss_); });
  EXPECT_NE(stale.find("read(\"loss\"): a transient of an earlier iteration"), std::string::npos)
      << "the last step's loss inside the next step, before it was added again: " << stale;
  (void)s.end_iteration();
  EXPECT_NE(usage_message([&] { (void)l.read(released); }).find("between iterations"), std::string::npos);
  EXPECT_NE(usage_message([&] { (void)l.read(unwritten); }).find("between iterations"), std::string::npos);
  EXPECT_NE(usage_message([&] { (void)l.read(l.loss_); }).find("between iterations"), std::string::npos)
      << "a step without the loss op kept the loss of the step before";
}

// A step the loop gives up keeps no metric: its loss is not the loss of a step that happened.
TEST(SessionMetrics, AnAbandonedStepKeepsNoMetric) {
  model host(9);
  Session s(config_for("lms", 0.5));
  loop l(s, host);
  l.step(1);
  s.begin_iteration();
  auto loss = s.add_transient("loss", loss_words * 4, tensor_kind::metric);
  {
    auto op = s.op("loss.forward", {l.w_[0]}, {loss});
    op.run([&](const host_access& h) { h.ptr<std::uint32_t>(loss)[0] = 1; });
  }
  s.abandon_iteration();
  EXPECT_NE(usage_message([&] { (void)l.read(loss); }).find("between iterations"), std::string::npos);
}

// A value one iteration hands to the next (a recurrent state) in a transient is refused, saying
// where it belongs; in a persistent tensor of kind optimizer_state it is carried, under a plan
// that moves it off the device between steps.
TEST(SessionMetrics, AValueHandedToTheNextIterationBelongsInAPersistentTensor) {
  for (const bool persistent : {false, true}) {
    Session s(config_for("lms", persistent ? 0.5 : 0.0));
    auto w = s.add_persistent("w", words * 4, tensor_kind::parameter);
    auto w2 = s.add_persistent("w2", words * 4, tensor_kind::parameter);
    auto state = persistent ? s.add_persistent("state", words * 4, tensor_kind::optimizer_state) : tensor_handle{};
    std::string refused;
    for (std::uint32_t it = 1; it <= 4 && refused.empty(); ++it) {
      s.begin_iteration();
      auto next = persistent ? state : s.add_transient("state", words * 4);
      try {
        auto op = s.op("cell.forward", {w, next}, {next});
        op.run([&](const host_access& h) {
          for (std::size_t i = 0; i < words; ++i) h.ptr<std::uint32_t>(next)[i] += it;
        });
      } catch (const usage_error& e) {
        refused = e.what();
      }
      auto pad = s.add_transient("pad", words * 4);  // another op's working set: the state may leave
      {
        auto op = s.op("head.forward", {w2}, {pad});
        op.run([&](const host_access& h) {
          for (std::size_t i = 0; i < words; ++i) h.ptr<std::uint32_t>(pad)[i] = it;
        });
      }
      s.release(pad);
      if (refused.empty()) (void)s.end_iteration();
    }
    if (!persistent) {
      EXPECT_NE(refused.find("holds no value"), std::string::npos) << refused;
      EXPECT_NE(refused.find("add_persistent, of kind optimizer_state"), std::string::npos) << refused;
      continue;
    }
    EXPECT_TRUE(refused.empty()) << refused;
    EXPECT_GT(s.history().back().h2d_bytes, 0u) << "nothing left the device: the state was not carried off it";
    words_t v(words);
    s.read(state, v.data(), words * 4);
    EXPECT_EQ(v, words_t(words, 1 + 2 + 3 + 4));
  }
}

// A loop that adds its loss once and has an op write it every step (the handle kept, as a loop
// with one buffer per tensor for the whole run does) reads each step's loss after its end.
TEST(SessionMetrics, AMetricAddedOnceAndWrittenEveryStepIsReadAfterEachStep) {
  for (const char* policy : {"none", "auto"}) {
    SCOPED_TRACE(policy);
    Session s(config_for(policy, 0));
    auto w = s.add_persistent("w", words * 4, tensor_kind::parameter);
    tensor_handle loss{};
    for (std::uint32_t step = 1; step <= 4; ++step) {
      s.begin_iteration();
      if (step == 1) loss = s.add_transient("loss", loss_words * 4, tensor_kind::metric);
      {
        auto op = s.op("loss.forward", {w}, {loss});
        op.run([&](const host_access& h) {
          for (std::size_t j = 0; j < loss_words; ++j) h.ptr<std::uint32_t>(loss)[j] = step * 10 + j;
        });
      }
      (void)s.end_iteration();
      words_t v(loss_words);
      ASSERT_NO_THROW(s.read(loss, v.data(), loss_words * 4)) << "step " << step;
      EXPECT_EQ(v[0], step * 10) << "step " << step;
      EXPECT_EQ(v[loss_words - 1], step * 10 + loss_words - 1) << "step " << step;
    }
  }
}
