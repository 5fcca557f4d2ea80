// Accumulation: an op may add into tensors (+=), which the library zero-fills at their first
// accumulation in an iteration, so a loop that zeroed its gradients at the start of a step drops
// that memset. Integer arithmetic, so every policy and budget must give the resident run's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/swap_policy.hpp"
#include "loop_config.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr int layers = 4;
constexpr std::size_t words = 16384;  // 64 KiB per tensor
constexpr std::uint64_t bytes = words * sizeof(std::uint32_t);
constexpr int micro_batches = 3;

template <class F>
void kernel(Session::op_scope& op, F f) {
  op.device().launch_kernel(op.stream(), std::move(f));
}

/// Per iteration: for each micro-batch, a forward op per layer into a transient and a backward
/// op per layer that adds into that layer's gradient; then w += g per layer. Returns every w
/// after the last iteration and g of the last iteration, read back.
std::vector<std::vector<std::uint32_t>> train(Session& s, int iterations) {
  std::vector<tensor_handle> w, g;
  std::vector<std::uint32_t> init(words);
  for (int l = 0; l < layers; ++l) {
    for (std::size_t i = 0; i < words; ++i) init[i] = static_cast<std::uint32_t>(i + 97 * l);
    w.push_back(s.add_persistent("w" + std::to_string(l), bytes, tensor_kind::parameter, init.data()));
    g.push_back(s.add_persistent("g" + std::to_string(l), bytes, tensor_kind::gradient));
  }
  std::vector<std::vector<std::uint32_t>> grads;
  for (int it = 1; it <= iterations; ++it) {
    s.begin_iteration();
    for (int mb = 0; mb < micro_batches; ++mb) {
      std::vector<tensor_handle> act;
      for (int l = 0; l < layers; ++l) {
        act.push_back(s.add_transient("act" + std::to_string(mb) + "." + std::to_string(l), bytes));
        auto op = s.op("fwd" + std::to_string(l), {w[l]}, {act[l]});
        kernel(op, [x = op.ptr<std::uint32_t>(w[l]), a = op.ptr<std::uint32_t>(act[l]), it, mb] {
          for (std::size_t i = 0; i < words; ++i) a[i] = x[i] * 3u + static_cast<std::uint32_t>(it * 10 + mb);
        });
      }
      for (int l = layers - 1; l >= 0; --l) {
        auto op = s.op("bwd" + std::to_string(l), {act[l]}, {}, {g[l]});
        kernel(op, [a = op.ptr<std::uint32_t>(act[l]), d = op.ptr<std::uint32_t>(g[l])] {
          for (std::size_t i = 0; i < words; ++i) d[i] += a[i] ^ 0x9e3779b9u;
        });
      }
      for (auto a : act) s.release(a);
    }
    for (int l = 0; l < layers; ++l) {
      auto op = s.op("sgd" + std::to_string(l), {w[l], g[l]}, {w[l]});
      kernel(op, [x = op.ptr<std::uint32_t>(w[l]), d = op.ptr<std::uint32_t>(g[l])] {
        for (std::size_t i = 0; i < words; ++i) x[i] += d[i] >> 7;
      });
    }
    // The gradients as each step left them, read inside it (a use the plan sees, as a loop
    // that logs gradient norms makes); the last step's are kept.
    grads.assign(layers, std::vector<std::uint32_t>(words));
    for (int l = 0; l < layers; ++l) s.read(g[l], grads[static_cast<std::size_t>(l)].data(), bytes);
    (void)s.end_iteration();
  }
  // After the loop a gradient's value is dead (the next step would zero it), so only the
  // parameters are read here.
  std::vector<std::vector<std::uint32_t>> out;
  for (int l = 0; l < layers; ++l) {
    out.emplace_back(words);
    s.read(w[l], out.back().data(), bytes);
    out.push_back(grads[static_cast<std::size_t>(l)]);
  }
  return out;
}

/// The same arithmetic on the host, gradients zeroed by hand at the start of each iteration.
std::vector<std::vector<std::uint32_t>> by_hand(int iterations) {
  std::vector<std::vector<std::uint32_t>> w(layers, std::vector<std::uint32_t>(words)), g = w;
  for (int l = 0; l < layers; ++l)
    for (std::size_t i = 0; i < words; ++i) w[l][i] = static_cast<std::uint32_t>(i + 97 * l);
  for (int it = 1; it <= iterations; ++it) {
    for (auto& x : g) std::fill(x.begin(), x.end(), 0u);
    for (int mb = 0; mb < micro_batches; ++mb)
      for (int l = 0; l < layers; ++l)
        for (std::size_t i = 0; i < words; ++i)
          g[l][i] += (w[l][i] * 3u + static_cast<std::uint32_t>(it * 10 + mb)) ^ 0x9e3779b9u;
    for (int l = 0; l < layers; ++l)
      for (std::size_t i = 0; i < words; ++i) w[l][i] += g[l][i] >> 7;
  }
  std::vector<std::vector<std::uint32_t>> out;
  for (int l = 0; l < layers; ++l) {
    out.push_back(w[l]);
    out.push_back(g[l]);
  }
  return out;
}

session_config config_for(const std::string& policy, std::uint64_t budget) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.policy = policy;
  c.device_budget = budget;
  return c;
}

}  // namespace

TEST(SessionAccumulate, GradientsStartFromZeroEachIterationAndSumEveryMicroBatch) {
  Session s(config_for("none", 0));
  EXPECT_EQ(train(s, 4), by_hand(4));
}

TEST(SessionAccumulate, EveryPolicyAndBudgetGivesTheResidentBits) {
  const auto want = by_hand(4);
  // Live at once: every w and g (8 x 64 KiB) and a micro-batch's activations (4 x 64 KiB).
  for (const char* policy : {"none", "lms", "vdnn", "auto"}) {
    for (std::uint64_t budget : {std::uint64_t{0}, 384_KiB}) {
      Session s(config_for(policy, budget));
      EXPECT_EQ(train(s, 4), want) << policy << " at " << budget;
      if (budget != 0) {
        EXPECT_LE(s.history().back().peak_device_bytes, budget);
        if (std::string(policy) != "none") {
          EXPECT_GT(s.history().back().h2d_bytes, 0u) << policy << ": nothing moved";
        }
      }
    }
  }
}

TEST(SessionAccumulate, TheFirstAccumulationOnlyWritesAndLaterOnesReadAndWrite) {
  Session s(config_for("none", 0));
  (void)train(s, 1);
  const trace& t = s.recorded_trace();
  const auto g0 = *t.find_tensor("g0");
  std::vector<std::size_t> uses;
  for (std::size_t k = 0; k < t.ops.size(); ++k)
    if (t.ops[k].name == "bwd0") uses.push_back(k);
  ASSERT_EQ(uses.size(), static_cast<std::size_t>(micro_batches));
  auto has = [](const std::vector<tensor_id>& v, tensor_id id) { return std::find(v.begin(), v.end(), id) != v.end(); };
  EXPECT_TRUE(has(t.ops[uses[0]].writes, g0));
  EXPECT_FALSE(has(t.ops[uses[0]].reads, g0)) << "zero-filled: no old value is read";
  for (std::size_t u = 1; u < uses.size(); ++u) {
    EXPECT_TRUE(has(t.ops[uses[u]].reads, g0));
    EXPECT_TRUE(has(t.ops[uses[u]].writes, g0));
  }
}

TEST(SessionAccumulate, ATensorBothWrittenAndAccumulatedIsMisuse) {
  Session s(config_for("none", 0));
  auto g = s.add_persistent("g", 1024, tensor_kind::gradient);
  s.begin_iteration();
  try {
    auto op = s.op("bwd", {}, {g}, {g});
    FAIL() << "no error";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"g\""), std::string::npos) << e.what();
  }
}

// A tensor an earlier op of the iteration set is added into, not zeroed first.
TEST(SessionAccumulate, ATensorAnEarlierOpSetIsAddedIntoNotZeroed) {
  Session s(config_for("none", 0));
  for (int it = 0; it < 3; ++it) {
    s.begin_iteration();
    auto t = s.add_transient("t", sizeof(std::uint32_t));
    {
      auto op = s.op("set", {}, {t});
      kernel(op, [p = op.ptr<std::uint32_t>(t)] { *p = 40; });
    }
    for (int k = 0; k < 2; ++k) {
      auto op = s.op("add", {}, {}, {t});
      kernel(op, [p = op.ptr<std::uint32_t>(t)] { *p += 1; });
    }
    std::uint32_t v = 0;
    s.read(t, &v, sizeof v);
    EXPECT_EQ(v, 42u) << "iteration " << it;
    s.release(t);
    (void)s.end_iteration();
  }
}

namespace {

// Note [Sums no op read]: gradient accumulation wrapped with an iteration per micro-batch and the
// optimizer every fourth. Each iteration's zero-fill would discard the last one's sum, so the
// optimizer's read is refused before it applies a quarter of the gradient; the loop that makes
// the whole step one iteration, and one that keeps the sum itself (reads and writes, zeroed by an
// op after the optimizer), get the same weights; a step that failed midway, a sum nobody reads (a
// frozen layer's) and a sum overwritten at each step's start refuse nothing.
constexpr std::size_t n = 1024;

struct accumulation_loop {
  explicit accumulation_loop(Session& s) : s_(s) {
    std::vector<std::uint32_t> init(n);
    for (std::size_t i = 0; i < n; ++i) init[i] = static_cast<std::uint32_t>(i * 11 + 1);
    w = s.add_persistent("w", n * 4, tensor_kind::parameter, init.data());
    g = s.add_persistent("g", n * 4, tensor_kind::gradient);
    frozen = s.add_persistent("frozen.grad", n * 4, tensor_kind::gradient);
  }
  enum class grad_op { accumulate, read_write, overwrite };
  /// One micro-batch's forward and backward into g (and into the frozen layer's gradient).
  void micro_batch(int mb, grad_op how) {
    auto a = s_.add_transient("a", n * 4);
    {
      auto op = s_.op("fwd", {w}, {a});
      op.run([&](const Session::op_scope::host_access& h) {
        for (std::size_t i = 0; i < n; ++i) h.ptr<std::uint32_t>(a)[i] = h.ptr<std::uint32_t>(w)[i] * 7 + static_cast<std::uint32_t>(mb);
      });
    }
    auto body = [&](const Session::op_scope::host_access& h) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t add = h.ptr<std::uint32_t>(a)[i] >> 2;
        h.ptr<std::uint32_t>(g)[i] = (how == grad_op::overwrite ? 0 : h.ptr<std::uint32_t>(g)[i]) + add;
      }
    };
    if (how == grad_op::accumulate) {
      auto op = s_.op("bwd", {a}, {}, {g, frozen});
      op.run(body);
    } else if (how == grad_op::read_write) {
      auto op = s_.op("bwd", {a, g}, {g}, {frozen});
      op.run(body);
    } else {
      auto op = s_.op("bwd", {a}, {g}, {frozen});
      op.run(body);
    }
    s_.release(a);
  }
  void optimizer() {
    auto op = s_.op("sgd", {w, g}, {w});
    op.run([&](const Session::op_scope::host_access& h) {
      for (std::size_t i = 0; i < n; ++i) h.ptr<std::uint32_t>(w)[i] += h.ptr<std::uint32_t>(g)[i] >> 5;
    });
  }
  void zero_grad() {
    auto op = s_.op("zero_grad", {}, {g});
    op.run([&](const Session::op_scope::host_access& h) { std::fill_n(h.ptr<std::uint32_t>(g), n, 0u); });
  }
  std::vector<std::uint32_t> weights() {
    std::vector<std::uint32_t> v(n);
    s_.read(w, v.data(), n * 4);
    return v;
  }
  Session& s_;
  tensor_handle w, g, frozen;
};

session_config accumulation_config(const char* policy) {
  return spillway::testing::config_for(policy, std::string(policy) == "none" ? 0 : 0.75);
}

TEST(SessionAccumulate, AnIterationPerMicroBatchIsRefusedBeforeTheOptimizerAppliesPartOfTheSum) {
  constexpr int steps = 3, k = 4;
  std::vector<std::uint32_t> want;
  {  // the whole step one iteration
    Session s(accumulation_config("none"));
    accumulation_loop l(s);
    for (int step = 0; step < steps; ++step) {
      s.begin_iteration();
      for (int mb = 0; mb < k; ++mb) l.micro_batch(mb, accumulation_loop::grad_op::accumulate);
      l.optimizer();
      (void)s.end_iteration();
    }
    want = l.weights();
  }
  for (const char* policy : {"none", "lms", "auto"}) {
    SCOPED_TRACE(policy);
    {  // an iteration per micro-batch, accumulating: refused at the optimizer, w untouched
      Session s(accumulation_config(policy));
      accumulation_loop l(s);
      const auto before = l.weights();
      for (int mb = 0; mb < k - 1; ++mb) {
        s.begin_iteration();
        l.micro_batch(mb, accumulation_loop::grad_op::accumulate);
        (void)s.end_iteration();
      }
      s.begin_iteration();
      l.micro_batch(k - 1, accumulation_loop::grad_op::accumulate);
      try {
        l.optimizer();
        ADD_FAILURE() << "the optimizer read a sum that lost three micro-batches";
      } catch (const usage_error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("op \"sgd\" reads \"g\""), std::string::npos) << m;
        EXPECT_NE(m.find("one micro-batch of a step"), std::string::npos) << m;
      }
      s.abandon_iteration();
      EXPECT_EQ(l.weights(), before) << "the refused optimizer step changed the weights";
    }
    {  // two micro-batches a step: refused by the second step's optimizer at the latest (one lost sum
       // alone may be a skipped step; a plan made from a micro-batch's iteration drops the gradient)
      Session s(accumulation_config(policy));
      accumulation_loop l(s);
      int refused_at = -1;
      for (int it = 0; it < 4 && refused_at < 0; ++it) {
        s.begin_iteration();
        l.micro_batch(it % 2, accumulation_loop::grad_op::accumulate);
        const auto before = l.weights();
        try {
          if (it % 2 == 1) l.optimizer();
          (void)s.end_iteration();
        } catch (const usage_error& e) {
          refused_at = it;
          EXPECT_NE(std::string(e.what()).find("sums from an earlier iteration"), std::string::npos) << e.what();
          s.abandon_iteration();
          EXPECT_EQ(l.weights(), before) << "the refused optimizer step changed the weights";
        }
      }
      EXPECT_TRUE(refused_at == 1 || refused_at == 3) << refused_at;
    }
    {  // an iteration per micro-batch, the sum kept by the loop (reads and writes, zeroed after the step)
      Session s(accumulation_config(policy));
      accumulation_loop l(s);
      for (int step = 0; step < steps; ++step)
        for (int mb = 0; mb < k; ++mb) {
          s.begin_iteration();
          l.micro_batch(mb, accumulation_loop::grad_op::read_write);
          if (mb == k - 1) {
            l.optimizer();
            l.zero_grad();
          }
          (void)s.end_iteration();
        }
      EXPECT_EQ(l.weights(), want);
    }
  }
}

TEST(SessionAccumulate, SkippedAndFailedStepsUnreadSumsAndOverwrittenSumsRefuseNothing) {
  for (const char* policy : {"none", "lms", "auto"}) {
    SCOPED_TRACE(policy);
    Session s(accumulation_config(policy));
    accumulation_loop l(s);
    for (int step = 0; step < 10; ++step) {
      s.begin_iteration();
      const auto how = step < 7 || step % 2 == 0 ? accumulation_loop::grad_op::accumulate
                                                 : accumulation_loop::grad_op::overwrite;
      l.micro_batch(0, how);
      l.micro_batch(1, accumulation_loop::grad_op::accumulate);
      if (step == 1 || step == 8) {  // its own error after the backward pass: the step is abandoned
        s.abandon_iteration();
        continue;
      }
      if (step == 2 || step == 5) {  // a loss that was not finite: the step ends without the optimizer
        (void)s.end_iteration();
        continue;
      }
      ASSERT_NO_THROW(l.optimizer()) << "step " << step;
      (void)s.end_iteration();
    }
    std::vector<std::uint32_t> host(n);
    EXPECT_NO_THROW(s.read(l.w, host.data(), n * 4));
  }
}

}  // namespace
