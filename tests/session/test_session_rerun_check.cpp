// check_reruns (Note [Checking reruns] in offload/session_rerun_check.cpp): a recomputable op
// whose rerun writes other bits than its first run is an error naming the op and the value,
// where without the check the loop would train on other numbers than the plain loop; bodies
// that keep their promise pass the check with the plain loop's bits, and a workspace's contents
// are not held to it. op_scope::seed() (Note [Op seeds] in offload/session.cpp): the same for an
// op's first run and its reruns, so a dropout mask drawn from it passes the check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/session_config.hpp"
#include "offload/swap_policy.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr int layers = 6;
constexpr std::size_t words = 16384;  // 64 KiB per tensor
constexpr std::uint64_t bytes = words * sizeof(std::uint32_t);
using vec = std::vector<std::uint32_t>;

// A slow link, where auto finds reruns worth their time.
session_config config_for(const std::string& policy, std::uint64_t budget, bool check) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.policy = policy;
  c.device_budget = budget;
  c.link_gbps = 0.25;
  c.check_reruns = check;
  c.cpu_debug_host_access = true;  // the strictest cpu backend: the check reads only by stream work
  return c;
}

std::uint32_t mix(std::uint32_t a, std::uint32_t b) { return (a * 2654435761u) ^ (b + (a >> 7)); }

// How the loop's bodies behave.
struct bodies {
  bool drift = false;      // layer 1's second forward op adds how often it ran in this iteration, less one
  bool noisy_ws = false;   // each first forward op also writes a workspace with what its run count gives
  bool dropout = false;    // each second forward op zeroes words by a mask drawn from op.seed()
  // Where given: per (step, op name), each seed() a run of that op saw.
  std::map<std::pair<int, std::string>, std::vector<std::uint64_t>>* seeds = nullptr;
};

struct result {
  std::vector<std::uint32_t> losses;
  vec w_sum;  // per layer, a checksum of the weights at the end
  bool operator==(const result&) const = default;
};

// A small loop with forward ops that may rerun: a[l+1] = g(f(w[l], a[l])); the loss mixes the
// last activation; each backward op reads its layer's forward values and adds to its gradient.
// With `s` null it runs on plain arrays, each op once.
result run(Session* s, int steps, const bodies& b) {
  result r;
  std::vector<vec> w(layers, vec(words)), g(layers, vec(words));
  for (int l = 0; l < layers; ++l)
    for (std::size_t i = 0; i < words; ++i) w[l][i] = mix(static_cast<std::uint32_t>(i), l);
  std::vector<tensor_handle> W, G;
  if (s != nullptr)
    for (int l = 0; l < layers; ++l) {
      W.push_back(s->add_persistent("w" + std::to_string(l), bytes, tensor_kind::parameter, w[l].data()));
      G.push_back(s->add_persistent("g" + std::to_string(l), bytes, tensor_kind::gradient));
    }
  std::uint32_t drift_runs = 0, ws_runs = 0;  // runs of the drifting op, of the workspace writers
  auto f = [](const std::uint32_t* w_, const std::uint32_t* a, std::uint32_t* h) {
    for (std::size_t i = 0; i < words; ++i) h[i] = a[i] * 3u + w_[i];
  };
  auto gfun = [](const std::uint32_t* h, std::uint32_t* a, std::uint32_t add) {
    for (std::size_t i = 0; i < words; ++i) a[i] = ((h[i] >> 1) ^ (h[i] << 7)) + add;
  };
  auto back = [](const std::uint32_t* a, const std::uint32_t* h, const std::uint32_t* w_, const std::uint32_t* d,
                 std::uint32_t* d_in, std::uint32_t* grad) {
    for (std::size_t i = 0; i < words; ++i) {
      grad[i] = (d[i] ^ h[i]) + a[i];
      d_in[i] = d[i] * 5u + w_[i];
    }
  };
  for (int step = 1; step <= steps; ++step) {
    drift_runs = 0;
    const auto st = static_cast<std::uint32_t>(step);
    if (s == nullptr) {  // the plain loop
      std::vector<vec> a(layers + 1, vec(words)), h(layers, vec(words));
      for (std::size_t i = 0; i < words; ++i) a[0][i] = mix(static_cast<std::uint32_t>(i), st);
      for (int l = 0; l < layers; ++l) {
        f(w[l].data(), a[l].data(), h[l].data());
        gfun(h[l].data(), a[l + 1].data(), 0);
      }
      std::uint32_t loss = 0;
      for (auto v : a[layers]) loss = loss * 31u + v;
      r.losses.push_back(loss);
      vec d(a[layers]), d_in(words);
      for (int l = layers - 1; l >= 0; --l) {
        back(a[l].data(), h[l].data(), w[l].data(), d.data(), d_in.data(), g[l].data());
        std::swap(d, d_in);
      }
      for (int l = 0; l < layers; ++l)
        for (std::size_t i = 0; i < words; ++i) w[l][i] += g[l][i] >> 5;
      continue;
    }
    s->begin_iteration();
    std::vector<tensor_handle> a, h;
    a.push_back(s->add_transient("a0", bytes));
    const auto a0 = a[0];
    s->recomputable_op("input.forward", {}, {a0}, [a0, st](const Session::op_scope& op) {
      op.run([&](const host_access& x) {
        for (std::size_t i = 0; i < words; ++i) x.ptr<std::uint32_t>(a0)[i] = mix(static_cast<std::uint32_t>(i), st);
      });
    });
    for (int l = 0; l < layers; ++l) {
      h.push_back(s->add_transient("h" + std::to_string(l), bytes));
      a.push_back(s->add_transient("a" + std::to_string(l + 1), bytes));
      const auto wl = W[l], in = a[l], mid = h[l], out = a[l + 1];
      if (b.noisy_ws) {
        const auto ws = s->add_transient("ws" + std::to_string(l), bytes, tensor_kind::workspace);
        s->recomputable_op("l" + std::to_string(l) + ".f.forward", {wl, in}, {mid, ws}, [=, &ws_runs](const Session::op_scope& op) {
          const std::uint32_t n = ws_runs++;
          op.run([&](const host_access& x) {
            f(x.ptr<std::uint32_t>(wl), x.ptr<std::uint32_t>(in), x.ptr<std::uint32_t>(mid));
            for (std::size_t i = 0; i < words; ++i) x.ptr<std::uint32_t>(ws)[i] = mix(n, static_cast<std::uint32_t>(i));
          });
        });
        s->release(ws);
      } else {
        s->recomputable_op("l" + std::to_string(l) + ".f.forward", {wl, in}, {mid}, [=](const Session::op_scope& op) {
          op.run([&](const host_access& x) { f(x.ptr<std::uint32_t>(wl), x.ptr<std::uint32_t>(in), x.ptr<std::uint32_t>(mid)); });
        });
      }
      const bool drifts = b.drift && l == 1;
      const std::string g_name = "l" + std::to_string(l) + ".g.forward";
      s->recomputable_op(g_name, {mid}, {out}, [=, &drift_runs](const Session::op_scope& op) {
        const std::uint32_t add = drifts ? drift_runs++ : 0;
        const std::uint64_t seed = op.seed();
        if (b.seeds != nullptr) (*b.seeds)[{step, g_name}].push_back(seed);
        op.run([&](const host_access& x) {
          gfun(x.ptr<std::uint32_t>(mid), x.ptr<std::uint32_t>(out), add);
          if (!b.dropout) return;
          std::mt19937_64 gen(seed);  // a generator made afresh from the op's seed at every run
          for (std::size_t i = 0; i < words; ++i)
            if ((gen() & 3u) == 0) x.ptr<std::uint32_t>(out)[i] = 0;
        });
      });
    }
    auto loss = s->add_transient("loss", sizeof(std::uint32_t), tensor_kind::metric);
    {
      auto op = s->op("loss.forward", {a[layers]}, {loss});
      op.run([&](const host_access& x) {
        std::uint32_t v = 0;
        for (std::size_t i = 0; i < words; ++i) v = v * 31u + x.ptr<std::uint32_t>(a[layers])[i];
        *x.ptr<std::uint32_t>(loss) = v;
      });
    }
    std::uint32_t lv = 0;
    s->read(loss, &lv, sizeof lv);
    r.losses.push_back(lv);
    s->release(loss);
    auto d = s->add_transient("d" + std::to_string(layers), bytes);
    {
      auto op = s->op("loss.backward", {a[layers]}, {d});
      op.run([&](const host_access& x) {
        std::copy_n(x.ptr<std::uint32_t>(a[layers]), words, x.ptr<std::uint32_t>(d));
      });
    }
    s->release(a[layers]);
    for (int l = layers - 1; l >= 0; --l) {
      auto d_in = s->add_transient("d" + std::to_string(l), bytes);
      {
        auto op = s->op("l" + std::to_string(l) + ".backward", {a[l], h[l], W[l], d}, {d_in, G[l]});
        op.run([&](const host_access& x) {
          back(x.ptr<std::uint32_t>(a[l]), x.ptr<std::uint32_t>(h[l]), x.ptr<std::uint32_t>(W[l]), x.ptr<std::uint32_t>(d),
               x.ptr<std::uint32_t>(d_in), x.ptr<std::uint32_t>(G[l]));
        });
      }
      s->release(d);
      s->release(a[l]);
      s->release(h[l]);
      d = d_in;
    }
    s->release(d);
    for (int l = 0; l < layers; ++l) {
      auto op = s->op("l" + std::to_string(l) + ".update", {W[l], G[l]}, {W[l]});
      op.run([&](const host_access& x) {
        for (std::size_t i = 0; i < words; ++i) x.ptr<std::uint32_t>(W[l])[i] += x.ptr<std::uint32_t>(G[l])[i] >> 5;
      });
    }
    s->end_iteration();
  }
  if (s != nullptr)
    for (int l = 0; l < layers; ++l) s->read(W[l], w[l].data(), bytes);
  for (int l = 0; l < layers; ++l) {
    std::uint32_t sum = 0;
    for (auto v : w[l]) sum = sum * 31u + v;
    r.w_sum.push_back(sum);
  }
  return r;
}

std::uint64_t reruns(const Session& s) {
  std::uint64_t n = 0;
  for (const auto& it : s.history()) n += it.recomputes;
  return n;
}

std::uint64_t footprint(const bodies& b) {
  Session probe(config_for("none", 0, false));
  (void)run(&probe, 1, b);
  return probe.footprint_bytes();
}

// The plans the tests run: they rerun ops, but which ones (and whether auto reruns any) depends
// on the op times the Session measures, so each test looks over all of them for the reruns it
// needs.
struct setting {
  const char* policy;
  std::uint64_t budget;
};
std::vector<setting> settings(std::uint64_t fp) {
  return {{"checkpoint", fp / 2}, {"auto", fp / 2}, {"auto", fp / 3}};
}

// Whether the Session's plan reruns an op whose name ends with `suffix`.
bool plan_reruns(const Session& s, const std::string& suffix) {
  if (s.current_plan() == nullptr) return false;
  const auto& ops = s.recorded_trace().ops;
  for (const auto& step : s.current_plan()->steps)
    for (const auto o : step.recomputes)
      if (ops.at(o).name.ends_with(suffix)) return true;
  return false;
}

// Each of settings() with check_reruns on gives `want`, refusing nothing; some plan reran an op
// (else nothing was checked).
void expect_checked_runs_give(const bodies& b, const result& want) {
  std::uint64_t checked = 0;
  for (const auto& [policy, budget] : settings(footprint(b))) {
    Session s(config_for(policy, budget, true));
    EXPECT_EQ(run(&s, 4, b), want) << policy << " at " << budget;
    checked += reruns(s);
  }
  EXPECT_GT(checked, 0u) << "no plan reran anything: nothing was checked";
}

}  // namespace

// The plain loop's bits under checkpoint and auto with the check on: bodies that keep their
// promise are never refused, and the plans do rerun them (else the check would check nothing).
TEST(SessionRerunCheck, BodiesThatKeepThePromisePassWithThePlainLoopsBits) {
  const bodies b;
  const auto want = run(nullptr, 4, b);
  expect_checked_runs_give(b, want);
}

// A body that counts its runs (as a dropout generator moves on): without the check a plan that
// reruns it silently gives other weights than the plain loop; with it, an iteration that reruns
// the op stops with a usage_error naming the op, the value and the setting. (Which ops a plan
// reruns depends on the op times measured, so a checked run whose plans happen not to rerun it
// must instead end with the plain loop's bits, and one of the settings must refuse.)
TEST(SessionRerunCheck, ARerunThatWritesOtherBitsIsAnErrorNamingTheOpAndTheValue) {
  bodies b;
  b.drift = true;
  const auto want = run(nullptr, 4, b);
  int refused = 0, drifted = 0;
  for (const auto& [policy, budget] : settings(footprint(b))) {
    {
      Session s(config_for(policy, budget, false));
      const auto got = run(&s, 4, b);
      if (plan_reruns(s, "l1.g.forward")) {
        ++drifted;
        EXPECT_NE(got, want) << policy << ": the drift did not change the result: the check would guard nothing";
      }
    }
    Session s(config_for(policy, budget, true));
    try {
      EXPECT_EQ(run(&s, 4, b), want) << policy << ": the op drifted and the check let it through";
      EXPECT_FALSE(plan_reruns(s, "l1.g.forward")) << policy << ": its plan reruns the op and nothing was refused";
    } catch (const usage_error& e) {
      ++refused;
      const std::string what = e.what();
      EXPECT_NE(what.find("check_reruns"), std::string::npos) << what;
      EXPECT_NE(what.find("\"l1.g.forward\""), std::string::npos) << what;
      EXPECT_NE(what.find("\"a2\""), std::string::npos) << what;
      EXPECT_NE(what.find("CRC32C 0x"), std::string::npos) << what;
      EXPECT_LT(s.history().size(), 4u) << "the loop did not stop at the refused rerun";
    }
  }
  EXPECT_GT(drifted, 0) << "no plan reran the drifting op without the check";
  EXPECT_GT(refused, 0) << "no plan reran the drifting op with the check: the test would check nothing";
}

// A workspace is scratch no later op reads: a rerun that leaves other bits in it is not refused,
// and the values the loop reads still match the plain loop's.
TEST(SessionRerunCheck, AWorkspaceMayHoldOtherBitsAfterARerun) {
  bodies b;
  b.noisy_ws = true;
  const auto want = run(nullptr, 4, b);
  int reran = 0;
  for (const auto& [policy, budget] : settings(footprint(b))) {
    Session s(config_for(policy, budget, true));
    EXPECT_EQ(run(&s, 4, b), want) << policy << " at " << budget;
    reran += plan_reruns(s, ".f.forward") ? 1 : 0;
  }
  EXPECT_GT(reran, 0) << "no op that writes a workspace ran again: the test would check nothing";
}

// A dropout mask drawn from a generator made afresh from op.seed() at each run: the reruns draw
// the first run's mask, so the check passes and the losses and weights are those of the run with
// everything resident (the same seeds: same iterations, same ops).
TEST(SessionOpSeeds, ADropoutDrawnFromTheOpsSeedPassesTheCheckWithResidentsBits) {
  bodies b;
  b.dropout = true;
  Session resident(config_for("none", 0, false));
  const auto want = run(&resident, 4, b);
  EXPECT_NE(want, run(nullptr, 4, b)) << "the masks dropped nothing: the test would test nothing";
  expect_checked_runs_give(b, want);
}

// seed(): one value per op and iteration, the same at its first run and each rerun, and no two
// ops or iterations share one.
TEST(SessionOpSeeds, AnOpsRerunsGetItsSeedOtherOpsAndIterationsOthers) {
  std::size_t rerun_seen = 0;
  for (const auto& [policy, budget] : settings(footprint(bodies{}))) {
    std::map<std::pair<int, std::string>, std::vector<std::uint64_t>> seeds;
    bodies b;
    b.seeds = &seeds;
    Session s(config_for(policy, budget, false));
    (void)run(&s, 4, b);
    std::set<std::uint64_t> distinct;
    for (const auto& [key, list] : seeds) {
      ASSERT_FALSE(list.empty());
      for (const auto v : list) EXPECT_EQ(v, list.front()) << policy << ": step " << key.first << " " << key.second;
      rerun_seen += list.size() - 1;
      distinct.insert(list.front());
    }
    EXPECT_EQ(seeds.size(), 4u * layers) << policy;
    EXPECT_EQ(distinct.size(), seeds.size()) << policy << ": two ops or iterations share a seed";
  }
  EXPECT_GT(rerun_seen, 0u) << "no rerun of a second forward op: the test would check only first runs";
}
