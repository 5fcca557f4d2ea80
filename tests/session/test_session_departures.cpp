// Iterations that depart from the recorded trace partway: the plan is followed up to the op where
// the iteration changes, then the iteration finishes on demand. A plan may drop a value its trace
// never reads again (the next traced use overwrites it); an iteration that departs and reads it
// first must still find it, for parameters and optimizer state; a plan may drop an activation for
// a rerun, and an iteration that reads it before the rerun gets it made again on demand. Every
// value is integer arithmetic checked against a host model of the same loop, at every policy and
// a tight budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/swap_policy.hpp"
#include "../swap/swap_test_support.hpp"
#include "loop_config.hpp"
#include "watchdog.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr int tensors = 8;
constexpr std::size_t words = 4096;  // 16 KiB per tensor
constexpr std::uint64_t bytes = words * 4;

/// One op: reads `in` (one or two tensors), writes `out`; in place when `out` is also read.
struct op_spec {
  std::vector<int> in;
  int out = 0;
  std::uint32_t salt = 0;
};

using model = std::vector<std::vector<std::uint32_t>>;

/// What the op computes, on the host model and in the kernel alike.
void apply(const op_spec& op, const std::vector<const std::uint32_t*>& in, std::uint32_t* out) {
  for (std::size_t i = 0; i < words; ++i) {
    std::uint32_t v = op.salt + static_cast<std::uint32_t>(i);
    for (const auto* x : in) v = (v ^ x[i]) * 2654435761u + (x[i] >> 7);
    out[i] = v;
  }
}

op_spec random_op(std::mt19937& rng) {
  op_spec op;
  op.in.push_back(static_cast<int>(rng() % tensors));
  if (rng() % 2 == 0) {
    int b = static_cast<int>(rng() % tensors);
    if (b != op.in[0]) op.in.push_back(b);
  }
  // Half the ops update a tensor they read; the others overwrite one without reading it.
  if (rng() % 2 == 0) {
    op.out = op.in[rng() % op.in.size()];
  } else {
    do {
      op.out = static_cast<int>(rng() % tensors);
    } while (std::find(op.in.begin(), op.in.end(), op.out) != op.in.end());
  }
  op.salt = static_cast<std::uint32_t>(rng());
  return op;
}

using spillway::testing::config_for;

/// With `nvme_dir`, everything that leaves the device goes to NVMe (a host tier of 4 KiB).
session_config config_for(const std::string& policy, double ratio, const std::string& nvme_dir) {
  session_config c = config_for(policy, ratio);
  c.host_budget = 4_KiB;
  c.nvme.directories = {nvme_dir};
  c.nvme.reserve = 64_MiB;
  return c;
}

/// Runs the iterations through a Session and returns every tensor's value after each iteration.
std::vector<model> run_session(const session_config& c, const std::vector<std::vector<op_spec>>& iterations,
                               const model& init) {
  Session s(c);
  std::vector<tensor_handle> t;
  for (int i = 0; i < tensors; ++i)
    t.push_back(s.add_persistent("t" + std::to_string(i), bytes,
                                 i % 2 == 0 ? tensor_kind::parameter : tensor_kind::optimizer_state, init[i].data()));
  std::vector<model> after;
  for (const auto& ops : iterations) {
    s.begin_iteration();
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const op_spec& o = ops[k];
      std::vector<tensor_handle> reads, writes{t[o.out]};
      for (int x : o.in) reads.push_back(t[x]);
      auto op = s.op("op" + std::to_string(k), reads, writes);
      std::vector<const std::uint32_t*> in;
      for (int x : o.in) in.push_back(op.ptr<std::uint32_t>(t[x]));
      op.device().launch_kernel(op.stream(), [o, in, out = op.ptr<std::uint32_t>(t[o.out])] { apply(o, in, out); });
    }
    (void)s.end_iteration();
    model m(tensors, std::vector<std::uint32_t>(words));
    for (int i = 0; i < tensors; ++i) s.read(t[i], m[i].data(), bytes);
    after.push_back(std::move(m));
  }
  return after;
}

std::vector<model> run_host(const std::vector<std::vector<op_spec>>& iterations, model m) {
  std::vector<model> after;
  for (const auto& ops : iterations) {
    for (const auto& o : ops) {
      std::vector<const std::uint32_t*> in;
      std::vector<std::vector<std::uint32_t>> copies;  // an in-place op reads the old value
      for (int x : o.in) copies.push_back(m[x]);
      for (const auto& c : copies) in.push_back(c.data());
      apply(o, in, m[o.out].data());
    }
    after.push_back(m);
  }
  return after;
}

// The trace: t1 is read, then overwritten three ops later, so under a tight budget a plan may
// free t1 after its read without copying it out. The next iteration departs right there and
// reads t1 first: it must see the value the first iteration left.
// A scope left alive when its step was given up (Note [Stale scopes]): ended later, in the next
// step, it ended that step's op of the same index; its ptr() named that op's tensors. With the
// three-list form of op() too, which most loops use.
TEST(SessionDepartures, AScopeLeftOpenByAGivenUpStepEndsNothingInTheNext) {
  Session s(config_for("none", 0));
  auto w = s.add_persistent("w", 4096, tensor_kind::parameter);
  s.begin_iteration();
  std::optional<Session::op_scope> stale;
  stale.emplace(s.op("fwd", {w}, {}));
  EXPECT_TRUE(s.abandon_iteration());
  s.begin_iteration();
  auto x = s.add_transient("x", 4096);
  {
    auto fresh = s.op("fwd", {w}, {x});
    EXPECT_THROW((void)stale->ptr(w), usage_error);
    stale.reset();  // ends nothing
    fresh.run([&](const auto& h) { std::memset(h.ptr(x), 1, 4096); });  // was: "whose scope has ended"
  }
  s.release(x);
  (void)s.end_iteration();
}

TEST(SessionDepartures, AParameterTheTraceOverwritesIsStillThereForAnIterationThatReadsItFirst) {
  spillway::testing::watchdog dog("AParameterTheTraceOverwrites", std::chrono::seconds(120));
  const std::vector<op_spec> recorded = {{{1}, 2, 11}, {{3}, 4, 12}, {{5}, 6, 13}, {{7}, 0, 14}, {{2}, 1, 15},
                                         {{1, 4}, 3, 16}};
  std::vector<op_spec> departing = recorded;
  departing[1] = {{1}, 5, 17};  // reads t1 where the trace had no use of it
  const std::vector<std::vector<op_spec>> iterations = {recorded, recorded, departing, recorded};
  model init(tensors, std::vector<std::uint32_t>(words));
  for (int i = 0; i < tensors; ++i)
    for (std::size_t w = 0; w < words; ++w) init[i][w] = static_cast<std::uint32_t>(w * 31 + i * 977 + 5);
  const auto want = run_host(iterations, init);
  for (const char* policy : {"lms", "vdnn", "auto", "checkpoint", "capuchin"}) {
    SCOPED_TRACE(policy);
    std::vector<model> got;
    ASSERT_NO_THROW(got = run_session(config_for(policy, 0.4), iterations, init));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << "after iteration " << i + 1;
  }
}

// Property: a recorded sequence of random ops, then iterations that follow it, change one op at a
// random place (a departure), or append one; the values after every iteration are the host's.
TEST(SessionDepartures, RandomDeparturesGiveTheHostValuesAtEveryPolicy) {
  spillway::testing::watchdog dog("RandomDepartures", std::chrono::seconds(240));
  std::mt19937 rng(spillway::test::test_seed(20261204));
  const char* const policies[] = {"none", "lms", "vdnn", "auto", "checkpoint", "capuchin"};
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<op_spec> base;
    const int n = 8 + static_cast<int>(rng() % 9);
    for (int k = 0; k < n; ++k) base.push_back(random_op(rng));
    std::vector<std::vector<op_spec>> iterations = {base, base};
    for (int it = 0; it < 4; ++it) {
      std::vector<op_spec> ops = iterations.back();
      switch (rng() % 3) {
        case 0: break;  // follows the plan
        case 1: ops[rng() % ops.size()] = random_op(rng); break;
        default: ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(rng() % ops.size()), random_op(rng)); break;
      }
      iterations.push_back(ops);
    }
    model init(tensors, std::vector<std::uint32_t>(words));
    for (int i = 0; i < tensors; ++i)
      for (std::size_t w = 0; w < words; ++w) init[i][w] = static_cast<std::uint32_t>(rng());
    const auto want = run_host(iterations, init);
    const char* policy = policies[trial % std::size(policies)];
    const double ratio = trial % 4 < 2 ? 0.4 : 0.6;
    const bool nvme = trial % 3 == 2;
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + policy + " at ratio " + std::to_string(ratio) +
                 (nvme ? ", spilling to NVMe" : ""));
    test::temp_dir dir;
    const session_config c = nvme ? config_for(policy, ratio, dir.path()) : config_for(policy, ratio);
    std::vector<model> got;
    ASSERT_NO_THROW(got = run_session(c, iterations, init));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << "after iteration " << i + 1;
  }
}

// A layered loop with recomputable forward ops: a0 = input, h = f1(w, a), a' = f2(h) per layer, a
// loss the host reads, a backward pass that reads every a and h again and adds into g, and
// w += g >> 5. `peeks` are host reads of an activation right after a layer's forward ops (a read
// the recorded iteration did not have is a departure, after the plan may have dropped its value
// for a rerun due in the backward pass).
struct peek {
  int after = 0;   // after layer `after`'s forward ops
  int layer = 0;   // of a[layer] (when !mid) or h[layer] (when mid), layer <= after
  bool mid = false;
  bool poke = false;  // an in-place op on it instead of a read: x ^= 0x9e3779b9
  bool operator==(const peek&) const = default;
};

struct layered {
  int layers = 5;
  std::vector<std::vector<std::uint32_t>> w;  // after the last step
  std::vector<std::vector<std::uint32_t>> readings;
  std::uint64_t recomputes = 0;
  std::size_t host_steps = 0;  // steps the plans in force ran on the host, summed over iterations
};

std::uint32_t f1(std::uint32_t w, std::uint32_t a) { return a * 3u + w; }
std::uint32_t f2(std::uint32_t h) { return (h >> 1) ^ (h << 7); }

layered run_layered_host(int layers, const std::vector<std::vector<peek>>& steps) {
  layered r;
  r.layers = layers;
  for (int l = 0; l < layers; ++l) {
    r.w.emplace_back(words);
    for (std::size_t i = 0; i < words; ++i) r.w[l][i] = static_cast<std::uint32_t>((i + 7 * l) * 40503u);
  }
  for (std::size_t step = 0; step < steps.size(); ++step) {
    std::vector<std::vector<std::uint32_t>> a(layers + 1, std::vector<std::uint32_t>(words)), h = a;
    for (std::size_t i = 0; i < words; ++i) a[0][i] = static_cast<std::uint32_t>(i * 2654435761u) + static_cast<std::uint32_t>(step);
    for (int l = 0; l < layers; ++l) {
      for (std::size_t i = 0; i < words; ++i) {
        h[l][i] = f1(r.w[l][i], a[l][i]);
        a[l + 1][i] = f2(h[l][i]);
      }
      for (const auto& p : steps[step]) {
        if (p.after != l) continue;
        auto& x = p.mid ? h[p.layer] : a[p.layer];
        if (p.poke) {
          for (auto& v : x) v ^= 0x9e3779b9u;
        } else {
          r.readings.push_back(x);
        }
      }
    }
    std::vector<std::uint32_t> d(words), d_in(words);
    for (std::size_t i = 0; i < words; ++i) d[i] = a[layers][i] ^ 0x5bd1e995u;
    for (int l = layers - 1; l >= 0; --l) {
      for (std::size_t i = 0; i < words; ++i) {
        const std::uint32_t g = (d[i] ^ h[l][i]) + a[l][i];
        d_in[i] = d[i] * 5u + r.w[l][i];
        r.w[l][i] += g >> 5;  // one step per iteration: the update folds in the gradient
      }
      std::swap(d, d_in);
    }
  }
  return r;
}

layered run_layered(const session_config& c, int layers, const std::vector<std::vector<peek>>& steps) {
  Session s(c);
  std::vector<tensor_handle> W, G;
  for (int l = 0; l < layers; ++l) {
    std::vector<std::uint32_t> init(words);
    for (std::size_t i = 0; i < words; ++i) init[i] = static_cast<std::uint32_t>((i + 7 * l) * 40503u);
    W.push_back(s.add_persistent("w" + std::to_string(l), bytes, tensor_kind::parameter, init.data()));
    G.push_back(s.add_persistent("g" + std::to_string(l), bytes, tensor_kind::gradient));
  }
  layered r;
  r.layers = layers;
  for (std::size_t step = 0; step < steps.size(); ++step) {
    s.begin_iteration();
    std::vector<tensor_handle> a, h;
    a.push_back(s.add_transient("a0", bytes));
    const auto st = static_cast<std::uint32_t>(step);
    s.recomputable_op("input.forward", {}, {a[0]}, [a0 = a[0], st](const Session::op_scope& op) {
      op.run([&](const host_access& x) {
        auto* p = x.ptr<std::uint32_t>(a0);
        for (std::size_t i = 0; i < words; ++i) p[i] = static_cast<std::uint32_t>(i * 2654435761u) + st;
      });
    });
    for (int l = 0; l < layers; ++l) {
      h.push_back(s.add_transient("h" + std::to_string(l), bytes));
      a.push_back(s.add_transient("a" + std::to_string(l + 1), bytes));
      const auto w = W[l], in = a[l], mid = h[l], out = a[l + 1];
      s.recomputable_op("l" + std::to_string(l) + ".f1.forward", {w, in}, {mid}, [=](const Session::op_scope& op) {
        op.run([&](const host_access& x) {
          for (std::size_t i = 0; i < words; ++i)
            x.ptr<std::uint32_t>(mid)[i] = f1(x.ptr<std::uint32_t>(w)[i], x.ptr<std::uint32_t>(in)[i]);
        });
      });
      s.recomputable_op("l" + std::to_string(l) + ".f2.forward", {mid}, {out}, [=](const Session::op_scope& op) {
        op.run([&](const host_access& x) {
          for (std::size_t i = 0; i < words; ++i) x.ptr<std::uint32_t>(out)[i] = f2(x.ptr<std::uint32_t>(mid)[i]);
        });
      });
      for (const auto& p : steps[step]) {
        if (p.after != l) continue;
        const auto x = p.mid ? h[p.layer] : a[p.layer];
        if (p.poke) {
          auto op = s.op("poke", {x}, {x});
          op.run([&](const host_access& m) {
            for (std::size_t i = 0; i < words; ++i) m.ptr<std::uint32_t>(x)[i] ^= 0x9e3779b9u;
          });
        } else {
          r.readings.emplace_back(words);
          s.read(x, r.readings.back().data(), bytes);
        }
      }
    }
    auto d = s.add_transient("d" + std::to_string(layers), bytes);
    {
      auto op = s.op("loss.backward", {a[layers]}, {d});
      op.run([&](const host_access& x) {
        for (std::size_t i = 0; i < words; ++i) x.ptr<std::uint32_t>(d)[i] = x.ptr<std::uint32_t>(a[layers])[i] ^ 0x5bd1e995u;
      });
    }
    s.release(a[layers]);
    for (int l = layers - 1; l >= 0; --l) {
      auto d_in = s.add_transient("d" + std::to_string(l), bytes);
      {
        auto op = s.op("l" + std::to_string(l) + ".backward", {a[l], h[l], W[l], d}, {d_in}, {G[l]});
        op.run([&](const host_access& x) {
          for (std::size_t i = 0; i < words; ++i) {
            x.ptr<std::uint32_t>(G[l])[i] += (x.ptr<std::uint32_t>(d)[i] ^ x.ptr<std::uint32_t>(h[l])[i]) + x.ptr<std::uint32_t>(a[l])[i];
            x.ptr<std::uint32_t>(d_in)[i] = x.ptr<std::uint32_t>(d)[i] * 5u + x.ptr<std::uint32_t>(W[l])[i];
          }
        });
      }
      s.release(d);
      s.release(a[l]);
      s.release(h[l]);
      d = d_in;
    }
    s.release(d);
    for (int l = 0; l < layers; ++l) {  // steps a plan may run on the host
      const auto w = W[l], g = G[l];
      auto update = [w, g](const host_access& x) {
        for (std::size_t i = 0; i < words; ++i) x.ptr<std::uint32_t>(w)[i] += x.ptr<std::uint32_t>(g)[i] >> 5;
      };
      s.host_capable_op("l" + std::to_string(l) + ".adam", {w, g}, {w},
                        [update](const Session::op_scope& op) { op.run(update); }, update, 2.0 * words);
    }
    const bool on_plan = s.current_plan() != nullptr;
    const std::size_t host_steps = on_plan ? s.current_plan()->host_op_count() : 0;
    const auto report = s.end_iteration();
    r.recomputes += report.recomputes;
    if (report.planned) r.host_steps += host_steps;
  }
  for (int l = 0; l < layers; ++l) {
    r.w.emplace_back(words);
    s.read(W[l], r.w.back().data(), bytes);
  }
  return r;
}

// Property: random host reads of activations, and in-place ops on them, added to and taken from
// the loop between iterations, under plans that drop activations for reruns; the values are the
// host's.
TEST(SessionDepartures, ReadsOfActivationsThePlanDroppedForARerunGiveTheHostValues) {
  spillway::testing::watchdog dog("ReadsOfActivations", std::chrono::seconds(240));
  std::mt19937 rng(spillway::test::test_seed(4122026));
  const char* const policies[] = {"checkpoint", "capuchin", "auto", "lms", "zero-offload"};
  std::uint64_t recomputes = 0;
  std::size_t host_steps = 0;
  for (int trial = 0; trial < 10; ++trial) {
    const int layers = 5 + static_cast<int>(rng() % 3);
    auto random_peek = [&] {
      peek p;
      p.after = static_cast<int>(rng() % layers);
      p.layer = static_cast<int>(rng() % (p.after + 1));
      p.mid = rng() % 2 == 0;
      p.poke = rng() % 3 == 0;
      return p;
    };
    std::vector<std::vector<peek>> steps = {{}, {}};
    for (int it = 0; it < 4; ++it) {
      std::vector<peek> ps = steps.back();
      if (rng() % 3 != 0) ps = {random_peek()};  // else the same reads as the iteration before
      if (rng() % 3 == 0) ps.push_back(random_peek());
      std::sort(ps.begin(), ps.end(), [](const peek& x, const peek& y) { return x.after < y.after; });
      steps.push_back(ps);
    }
    const auto want = run_layered_host(layers, steps);
    const char* policy = policies[trial % std::size(policies)];
    const double ratio = trial % 2 == 0 ? 0.4 : 0.55;
    // (zero-offload runs the steps on the host: its tensors must fit the host tier, so no NVMe there)
    const bool nvme = trial % 3 == 1 && std::string(policy) != "zero-offload";
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + policy + " at ratio " + std::to_string(ratio) + ", " +
                 std::to_string(layers) + " layers" + (nvme ? ", spilling to NVMe" : ""));
    test::temp_dir dir;
    const session_config c = nvme ? config_for(policy, ratio, dir.path()) : config_for(policy, ratio);
    layered got;
    ASSERT_NO_THROW(got = run_layered(c, layers, steps));
    EXPECT_TRUE(got.readings == want.readings);
    EXPECT_TRUE(got.w == want.w);
    recomputes += got.recomputes;
    host_steps += got.host_steps;
  }
  EXPECT_GT(recomputes, 0u) << "no plan dropped an activation for a rerun: the test checks nothing it means to";
  EXPECT_GT(host_steps, 0u) << "no plan ran an optimizer step on the host";
}

}  // namespace

namespace {

// The one value a plan may drop that a departing iteration can miss: a gradient after the step
// read it, dead because the recorded backward pass overwrites it before reading it. An op that
// reads it first gets a usage_error that names it and says why.
TEST(SessionDepartures, AGradientReadBeforeTheTracesOverwriteIsAnErrorThatSaysWhy) {
  Session s(config_for("lms", 0));
  std::vector<tensor_handle> w, g;
  for (int i = 0; i < 4; ++i) {
    w.push_back(s.add_persistent("w" + std::to_string(i), bytes, tensor_kind::parameter));
    g.push_back(s.add_persistent("g" + std::to_string(i), bytes, tensor_kind::gradient));
  }
  auto iteration = [&](bool read_first) {
    s.begin_iteration();
    if (read_first) { auto op = s.op("log.grad_norm", {g[0]}, {}); }
    for (int i = 3; i >= 0; --i) { auto op = s.op("bwd" + std::to_string(i), {w[i]}, {g[i]}); }
    for (int i = 0; i < 4; ++i) { auto op = s.op("adam" + std::to_string(i), {w[i], g[i]}, {w[i]}); }
    (void)s.end_iteration();
  };
  iteration(false);  // records at the whole device
  s.set_device_budget(3 * bytes);
  iteration(false);
  iteration(false);  // follows: every gradient leaves after its step, dead
  try {
    iteration(true);
    FAIL() << "a dropped gradient was read";
  } catch (const usage_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("\"g0\""), std::string::npos) << m;
    EXPECT_NE(m.find("gradient"), std::string::npos) << m;
    EXPECT_NE(m.find("optimizer_state"), std::string::npos) << m;
  }
}

// The same gradient read from the host (Note [Dropped gradients] in prefetch/executor.cpp): a log
// of it inside one step in three, or after end_iteration, finds the value the plan dropped and is
// an error that says how to read it; the steps that read it under their own tag are planned with
// the read and give the value everything resident gives.
TEST(SessionDepartures, AGradientLoggedFromTheHostIsReadUnderItsOwnTagAndOtherwiseRefusedWithHow) {
  auto run = [](const char* policy, bool tag, std::vector<std::string>* errors) {
    Session s(config_for(policy, 0));
    std::vector<tensor_handle> w, g;
    std::vector<std::uint32_t> init(words);
    for (int i = 0; i < 4; ++i) {
      for (std::size_t k = 0; k < words; ++k) init[k] = static_cast<std::uint32_t>(k * 5 + i);
      w.push_back(s.add_persistent("w" + std::to_string(i), bytes, tensor_kind::parameter, init.data()));
      g.push_back(s.add_persistent("g" + std::to_string(i), bytes, tensor_kind::gradient));
    }
    std::vector<std::vector<std::uint32_t>> logged;
    std::vector<std::uint32_t> host(words);
    for (int step = 1; step <= 9; ++step) {
      const bool log = step % 3 == 0;
      s.begin_iteration(log && tag ? "log" : "train");
      for (int i = 3; i >= 0; --i) {
        auto op = s.op("bwd" + std::to_string(i), {w[i]}, {g[i]});
        op.run([&](const Session::op_scope::host_access& h) {
          for (std::size_t k = 0; k < words; ++k) h.ptr<std::uint32_t>(g[i])[k] = h.ptr<std::uint32_t>(w[i])[k] * 3 + step;
        });
      }
      for (int i = 0; i < 4; ++i) {
        auto op = s.op("adam" + std::to_string(i), {w[i], g[i]}, {w[i]});
        op.run([&](const Session::op_scope::host_access& h) {
          for (std::size_t k = 0; k < words; ++k) h.ptr<std::uint32_t>(w[i])[k] += h.ptr<std::uint32_t>(g[i])[k] >> 4;
        });
      }
      try {
        if (log) {
          s.read(g[0], host.data(), bytes);  // inside the step, after its last use
          logged.push_back(host);
        }
        (void)s.end_iteration();
        if (step == 1) s.set_device_budget(3 * bytes);
        if (log && !tag) s.read(g[1], host.data(), bytes);  // after the step
      } catch (const usage_error& e) {
        if (errors == nullptr) throw;
        errors->push_back(e.what());
        s.abandon_iteration();
      }
    }
    return logged;
  };
  const auto want = run("none", false, nullptr);
  ASSERT_EQ(want.size(), 3u);
  for (const char* policy : {"lms", "auto"}) {
    SCOPED_TRACE(policy);
    EXPECT_EQ(run(policy, true, nullptr), want) << "the steps under their own tag";
    std::vector<std::string> errors;
    (void)run(policy, false, &errors);
    ASSERT_FALSE(errors.empty()) << "no plan dropped the gradients: the test checks nothing";
    for (const auto& m : errors) {
      EXPECT_TRUE(m.find("gradient \"g0\"") != std::string::npos || m.find("gradient \"g1\"") != std::string::npos) << m;
      EXPECT_NE(m.find("dropped after its last read"), std::string::npos) << m;
      EXPECT_NE(m.find("under their own tag"), std::string::npos) << m;
    }
  }
}

}  // namespace
