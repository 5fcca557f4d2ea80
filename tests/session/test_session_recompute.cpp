// Recomputable ops: a loop declares its forward ops with their bodies (recomputable_op), and
// plans that drop what they wrote run them again before the backward pass reads it. Integer
// arithmetic on host code (op.run), so every policy and budget must give the bits of the same
// loop on plain host arrays, reruns or not.
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../swap/swap_test_support.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "offload/rerun_schedule.hpp"
#include "offload/session_hooks.hpp"
#include "offload/swap_policy.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr int layers = 6;
constexpr std::size_t words = 16384;  // 64 KiB per tensor
constexpr std::uint64_t bytes = words * sizeof(std::uint32_t);
using vec = std::vector<std::uint32_t>;

session_config config_for(const std::string& policy, std::uint64_t budget) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.policy = policy;
  c.device_budget = budget;
  c.link_gbps = 8;
  return c;
}

// The layer code, on plain pointers.
void input(std::uint32_t* a, std::uint32_t step) {
  for (std::size_t i = 0; i < words; ++i) a[i] = static_cast<std::uint32_t>(i * 2654435761u) + step;
}
void forward1(const std::uint32_t* w, const std::uint32_t* a, std::uint32_t* h) {
  for (std::size_t i = 0; i < words; ++i) h[i] = a[i] * 3u + w[i];
}
void forward2(const std::uint32_t* h, std::uint32_t* a) {
  for (std::size_t i = 0; i < words; ++i) a[i] = (h[i] >> 1) ^ (h[i] << 7);
}
std::uint32_t loss_of(const std::uint32_t* a) {
  std::uint32_t s = 0;
  for (std::size_t i = 0; i < words; ++i) s = s * 31u + a[i];
  return s;
}
void loss_backward(const std::uint32_t* a, std::uint32_t* d) {
  for (std::size_t i = 0; i < words; ++i) d[i] = a[i] ^ 0x5bd1e995u;
}
void backward(const std::uint32_t* a, const std::uint32_t* h, const std::uint32_t* w, const std::uint32_t* d_out,
              std::uint32_t* d_in, std::uint32_t* g) {
  for (std::size_t i = 0; i < words; ++i) {
    g[i] += (d_out[i] ^ h[i]) + a[i];
    d_in[i] = d_out[i] * 5u + w[i];
  }
}
void update(std::uint32_t* w, const std::uint32_t* g) {
  for (std::size_t i = 0; i < words; ++i) w[i] += g[i] >> 5;
}
vec initial_w(int l) {
  vec w(words);
  for (std::size_t i = 0; i < words; ++i) w[i] = static_cast<std::uint32_t>((i + 7 * l) * 40503u);
  return w;
}

struct result {
  std::vector<std::uint32_t> losses;
  std::vector<vec> w;
  bool operator==(const result&) const = default;
};

result plain(int steps) {
  result r;
  for (int l = 0; l < layers; ++l) r.w.push_back(initial_w(l));
  std::vector<vec> a(layers + 1, vec(words)), h(layers, vec(words)), g(layers, vec(words));
  vec d(words), d_in(words);
  for (int s = 1; s <= steps; ++s) {
    input(a[0].data(), static_cast<std::uint32_t>(s));
    for (int l = 0; l < layers; ++l) {
      forward1(r.w[l].data(), a[l].data(), h[l].data());
      forward2(h[l].data(), a[l + 1].data());
    }
    r.losses.push_back(loss_of(a[layers].data()));
    loss_backward(a[layers].data(), d.data());
    for (int l = layers - 1; l >= 0; --l) {
      std::fill(g[l].begin(), g[l].end(), 0u);
      backward(a[l].data(), h[l].data(), r.w[l].data(), d.data(), d_in.data(), g[l].data());
      std::swap(d, d_in);
    }
    for (int l = 0; l < layers; ++l) update(r.w[l].data(), g[l].data());
  }
  return r;
}

/// Ops, first runs and reruns, whose stream() was not the Session's stream() (Session::stream).
int foreign_streams = 0;

/// The loop on a Session, its forward ops recomputable (all of them when `recompute`).
/// `plain_from`: from that step on, the forward ops are plain op()s (a change of the trace).
result wrapped(Session& s, int steps, int plain_from = 1 << 30) {
  std::vector<tensor_handle> W, G;
  for (int l = 0; l < layers; ++l) {
    const auto init = initial_w(l);
    W.push_back(s.add_persistent("w" + std::to_string(l), bytes, tensor_kind::parameter, init.data()));
    G.push_back(s.add_persistent("g" + std::to_string(l), bytes, tensor_kind::gradient));
  }
  result r;
  for (int step = 1; step <= steps; ++step) {
    s.begin_iteration();
    const bool rec = step < plain_from;
    auto fwd = [&](const std::string& name, std::initializer_list<tensor_handle> reads,
                   std::initializer_list<tensor_handle> writes, const Session::op_body& op_body) {
      const Session::op_body body = [&s, op_body](const Session::op_scope& op) {
        if (op.stream() != s.stream()) ++foreign_streams;
        op_body(op);
      };
      if (rec) {
        s.recomputable_op(name, reads, writes, body);
      } else {
        auto op = s.op(name, reads, writes);
        body(op);
      }
    };
    std::vector<tensor_handle> a, h;
    a.push_back(s.add_transient("a0", bytes));
    const auto st = static_cast<std::uint32_t>(step);
    const auto a0 = a[0];
    fwd("input.forward", {}, {a0}, [a0, st](const Session::op_scope& op) {
      op.run([&](const host_access& x) { input(x.ptr<std::uint32_t>(a0), st); });
    });
    for (int l = 0; l < layers; ++l) {
      h.push_back(s.add_transient("h" + std::to_string(l), bytes));
      a.push_back(s.add_transient("a" + std::to_string(l + 1), bytes));
      const auto w = W[l], in = a[l], mid = h[l], out = a[l + 1];
      fwd("l" + std::to_string(l) + ".f1.forward", {w, in}, {mid}, [=](const Session::op_scope& op) {
        op.run([&](const host_access& x) { forward1(x.ptr<std::uint32_t>(w), x.ptr<std::uint32_t>(in), x.ptr<std::uint32_t>(mid)); });
      });
      fwd("l" + std::to_string(l) + ".f2.forward", {mid}, {out}, [=](const Session::op_scope& op) {
        op.run([&](const host_access& x) { forward2(x.ptr<std::uint32_t>(mid), x.ptr<std::uint32_t>(out)); });
      });
    }
    auto loss = s.add_transient("loss", sizeof(std::uint32_t), tensor_kind::metric);
    {
      auto op = s.op("loss.forward", {a[layers]}, {loss});
      op.run([&](const host_access& x) { *x.ptr<std::uint32_t>(loss) = loss_of(x.ptr<std::uint32_t>(a[layers])); });
    }
    std::uint32_t lv = 0;
    s.read(loss, &lv, sizeof lv);
    r.losses.push_back(lv);
    s.release(loss);
    auto d = s.add_transient("d" + std::to_string(layers), bytes);
    {
      auto op = s.op("loss.backward", {a[layers]}, {d});
      op.run([&](const host_access& x) { loss_backward(x.ptr<std::uint32_t>(a[layers]), x.ptr<std::uint32_t>(d)); });
    }
    s.release(a[layers]);
    for (int l = layers - 1; l >= 0; --l) {
      auto d_in = s.add_transient("d" + std::to_string(l), bytes);
      {
        auto op = s.op("l" + std::to_string(l) + ".backward", {a[l], h[l], W[l], d}, {d_in}, {G[l]});
        op.run([&](const host_access& x) {
          backward(x.ptr<std::uint32_t>(a[l]), x.ptr<std::uint32_t>(h[l]), x.ptr<std::uint32_t>(W[l]),
                   x.ptr<std::uint32_t>(d), x.ptr<std::uint32_t>(d_in), x.ptr<std::uint32_t>(G[l]));
        });
      }
      s.release(d);
      s.release(a[l]);
      s.release(h[l]);
      d = d_in;
    }
    s.release(d);
    for (int l = 0; l < layers; ++l) {
      auto op = s.op("l" + std::to_string(l) + ".adam", {W[l], G[l]}, {W[l]});
      op.run([&](const host_access& x) { update(x.ptr<std::uint32_t>(W[l]), x.ptr<std::uint32_t>(G[l])); });
    }
    s.end_iteration();
  }
  for (int l = 0; l < layers; ++l) {
    r.w.emplace_back(words);
    s.read(W[l], r.w.back().data(), bytes);
  }
  return r;
}

std::uint64_t total_recomputes(const Session& s) {
  std::uint64_t n = 0;
  for (const auto& r : s.history()) n += r.recomputes;
  return n;
}

}  // namespace

TEST(SessionRecompute, EveryPolicyAtEveryBudgetGivesThePlainLoopsBits) {
  const auto want = plain(4);
  Session probe(config_for("none", 0));
  EXPECT_EQ(wrapped(probe, 1), plain(1));
  const std::uint64_t footprint = probe.footprint_bytes();
  const std::uint64_t least = probe.least_budget_bytes();
  ASSERT_GT(footprint, 0u);
  EXPECT_TRUE(probe.recorded_trace().ops[1].recomputable);
  EXPECT_FALSE(probe.recorded_trace().ops[2 * layers + 1].recomputable);  // loss.forward
  std::uint64_t reruns_seen = 0;
  for (const char* policy : {"none", "lms", "vdnn", "auto", "checkpoint", "capuchin"}) {
    for (const std::uint64_t budget : {std::uint64_t{0}, footprint / 2, footprint / 4, least + least / 8}) {
      if (budget != 0 && budget < least) continue;
      Session s(config_for(policy, budget));
      EXPECT_EQ(wrapped(s, 4), want) << policy << " at " << budget;
      const auto& last = s.history().back();
      EXPECT_TRUE(last.planned) << policy << " at " << budget;
      if (budget != 0) {
        EXPECT_LE(last.peak_device_bytes, budget) << policy;
      }
      ASSERT_NE(s.current_plan(), nullptr);
      // The iteration ran every rerun its plan has (no more: none is on demand).
      EXPECT_EQ(last.recomputes, s.current_plan()->recompute_count()) << policy << " at " << budget;
      reruns_seen += total_recomputes(s);
    }
  }
  EXPECT_GT(reruns_seen, 0u) << "no plan recomputed anything: the test would not test reruns";
}

TEST(SessionRecompute, CheckpointRecomputesAtHalfTheFootprintAndKeepsTheBits) {
  Session probe(config_for("none", 0));
  (void)wrapped(probe, 1);
  const std::uint64_t budget = probe.footprint_bytes() / 2;
  Session s(config_for("checkpoint", budget));
  EXPECT_EQ(wrapped(s, 5), plain(5));
  EXPECT_GT(s.current_plan()->recompute_count(), 0u);
  EXPECT_EQ(s.history().back().recomputes, s.current_plan()->recompute_count());
  EXPECT_EQ(s.history().back().on_demand_fetches, 0u);
  EXPECT_LE(s.history().back().peak_device_bytes, budget);
}

// A loop that gives its library handles one stream at its start gives them Session::stream():
// every op's stream(), first runs and reruns, is that stream, and a new budget keeps it.
TEST(SessionRecompute, EveryOpAndEveryRerunIsOnTheSessionsOneStream) {
  Session probe(config_for("none", 0));
  (void)wrapped(probe, 1);
  Session s(config_for("checkpoint", probe.footprint_bytes() / 2));
  const stream first = s.stream();
  EXPECT_NE(first.handle, nullptr);
  foreign_streams = 0;
  EXPECT_EQ(wrapped(s, 4), plain(4));
  EXPECT_GT(total_recomputes(s), 0u) << "no rerun: the test would not see their streams";
  EXPECT_EQ(foreign_streams, 0);
  s.set_device_budget(probe.footprint_bytes() / 3 * 2);
  EXPECT_EQ(s.stream(), first);
}

// Reruns show on a track of their own in the Chrome trace: checkpoint at half the footprint runs
// forward ops again in the backward pass; each rerun is a span on the "recompute" track (named
// for the op it runs again), none is on the compute track, and the compute track still holds
// every op of every iteration once.
TEST(SessionRecompute, RerunsShowOnTheRecomputeTrackOfTheChromeTrace) {
  Session probe(config_for("none", 0));
  (void)wrapped(probe, 1);
  const std::size_t ops = probe.recorded_trace().ops.size();
  test::temp_dir dir;
  auto c = config_for("checkpoint", probe.footprint_bytes() / 2);
  c.chrome_trace = dir.path() + "/trace.json";
  constexpr int iterations = 4;
  std::uint64_t reruns = 0;
  {
    Session s(c);
    EXPECT_EQ(wrapped(s, iterations), plain(iterations));
    reruns = total_recomputes(s);
  }  // the Session writes the trace when it closes
  ASSERT_GT(reruns, 0u) << "the plan reran nothing: the test would check nothing";
  std::ifstream in(c.chrome_trace);
  ASSERT_TRUE(in.good()) << "no trace at " << c.chrome_trace;
  const auto j = nlohmann::json::parse(in);
  std::map<int, std::string> tracks;
  for (const auto& e : j.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name") tracks[e.at("tid").get<int>()] = e.at("args").at("name");
  std::size_t on_compute = 0, on_recompute = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const std::string track = tracks.at(e.at("tid").get<int>());
    const std::string name = e.at("name");
    if (track == "compute") {
      ++on_compute;
      EXPECT_NE(name.rfind("rerun: ", 0), 0u) << "a rerun on the compute track: " << name;
    }
    if (track == "recompute") {
      ++on_recompute;
      EXPECT_EQ(name.rfind("rerun: ", 0), 0u) << name;
    }
  }
  EXPECT_EQ(on_recompute, reruns);
  EXPECT_EQ(on_compute, iterations * ops) << "every op of every iteration, once";
}

TEST(SessionRecompute, ChainedRerunsOfReleasedOutputsGiveTheSameBits) {
  // A hand-made plan: every forward output is dropped after its last forward reader, and before
  // layer l's backward op the whole chain that makes its inputs runs again: input, then f1 and
  // f2 of layers 0..l. f2 of layer l writes a[l+1], which the program has already released
  // (layer l+1's backward came first): it is made for the step and freed after the op.
  session_hooks hooks;
  hooks.edit_plan = [](const trace& t, plan& p) {
    auto is = [&](op_index o, const std::string& part) { return t.ops[o].name.find(part) != std::string::npos; };
    for (op_index k = 0; k < t.ops.size(); ++k) {
      if (!is(k, ".backward") || is(k, "loss")) continue;
      const int l = std::stoi(t.ops[k].name.substr(1));
      for (op_index o = 0; o < k; ++o) {
        if (!t.ops[o].recomputable) continue;
        const std::string& n = t.ops[o].name;
        if (n == "input.forward" || std::stoi(n.substr(1)) <= l) p.steps[k].recomputes.push_back(o);
      }
    }
    for (op_index o = 0; o < t.ops.size(); ++o) {
      if (!t.ops[o].recomputable) continue;
      for (auto x : t.ops[o].writes) {
        op_index last = o;
        for (op_index r = o + 1; r < t.ops.size(); ++r)
          if (is(r, ".forward") && std::find(t.ops[r].reads.begin(), t.ops[r].reads.end(), x) != t.ops[r].reads.end()) last = r;
        p.steps[last].evictions.push_back(eviction{x, evict_action::drop});
      }
    }
    for (op_index k = 0; k < t.ops.size(); ++k)  // what a step's reruns made leaves again after it
      for (auto o : p.steps[k].recomputes)
        for (auto x : t.ops[o].writes) p.steps[k].evictions.push_back(eviction{x, evict_action::drop});
  };
  Session s(config_for("none", 0), hooks);
  EXPECT_EQ(wrapped(s, 4), plain(4));
  constexpr std::uint64_t chain = layers + 2 * layers * (layers + 1) / 2;  // input + 2 per layer, per backward op
  EXPECT_EQ(s.history().back().recomputes, chain);
  EXPECT_EQ(s.history()[1].recomputes, chain);
  EXPECT_EQ(s.history()[0].recomputes, 0u);  // the recording step runs on demand
  EXPECT_EQ(s.history().back().on_demand_fetches, 0u);  // every dropped value was made again in time
}

TEST(SessionRecompute, SpreadChainsGiveTheSameBits) {
  // Every value a rerun can make is dropped, and each chain of reruns is spread over the ops
  // before the one it serves (Note [Rerun schedules]): the values it makes, some of them
  // already released by the program, are kept from one step to the next until the rerun that
  // reads them (Note [Rerun temps across steps]). The plan is the rerun schedule's, with lms
  // on the folded trace at a budget it fits whole.
  std::size_t spread_steps = 0;
  session_hooks hooks;
  hooks.edit_plan = [&](const trace& t, plan& p) {
    offload::hw_profile hw;
    hw.name = "test";
    hw.device_bytes = 1ull << 40;
    hw.compute_flops_per_s = 1e12;
    hw.hbm_bytes_per_s = 1e12;
    hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = 1e9;
    hw.copy_engines = 2;
    hw.host_bytes = 1ull << 40;
    const auto r = offload::analyze(t);
    const auto cands = offload::detail::remake_candidates(t, r, hw);
    const std::vector<char> want(t.tensors.size(), 1);
    const auto s = offload::detail::schedule_reruns(t, r, hw, cands, want, true, true);
    const auto fr = offload::analyze(s.folded);
    p = offload::detail::unfold_plan(offload::make_planner("lms")->make_plan(s.folded, fr, hw, fr.peak_live_bytes), s,
                                     t.tensors.size());
    spread_steps = 0;
    for (op_index k = 0; k < p.steps.size(); ++k)
      for (op_index o : p.steps[k].recomputes) {
        bool serves_k = false;
        for (tensor_id z : t.ops[o].writes)
          serves_k |= std::find(t.ops[k].reads.begin(), t.ops[k].reads.end(), z) != t.ops[k].reads.end();
        spread_steps += !serves_k;
      }
  };
  Session s(config_for("none", 0), hooks);
  EXPECT_EQ(wrapped(s, 4), plain(4));
  EXPECT_GT(spread_steps, 0u) << "no chain was spread: the test would not test it";
  ASSERT_NE(s.current_plan(), nullptr);
  EXPECT_GT(s.history().back().recomputes, 0u);
  EXPECT_EQ(s.history().back().recomputes, s.current_plan()->recompute_count());
  EXPECT_EQ(s.history().back().on_demand_fetches, 0u);  // every dropped value was made again in time
}

TEST(SessionRecompute, AnOpRecomputableOnceAndPlainLaterIsAChangeOfTraceWithTheSameBits) {
  Session s(config_for("checkpoint", 0));
  EXPECT_EQ(wrapped(s, 4, 3), plain(4));
  EXPECT_TRUE(s.history()[1].planned);
  EXPECT_FALSE(s.history()[2].planned);  // departed: recorded again
  EXPECT_TRUE(s.history()[3].planned);
  EXPECT_FALSE(s.recorded_trace().ops[1].recomputable);
}

TEST(SessionRecompute, MisuseIsRefusedNamingTheOp) {
  Session s(config_for("none", 0));
  auto w = s.add_persistent("w", 64, tensor_kind::parameter);
  s.begin_iteration();
  auto x = s.add_transient("x", 64);
  auto y = s.add_transient("y", 64);
  auto body = [](const Session::op_scope&) {};
  auto expect_refused = [&](auto f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "not refused: " << words;
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.forward"), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { s.recomputable_op("bad.forward", {x}, {w}, body); }, "\"w\"");
  expect_refused([&] { s.recomputable_op("bad.forward", {x}, {x}, body); }, "in place");
  expect_refused([&] { s.recomputable_op("bad.forward", {}, {x}, Session::op_body{}); }, "no body");
  // None of them ran: the first op of the iteration is the one that follows.
  s.recomputable_op("good.forward", {}, {x}, [&](const Session::op_scope& op) { std::memset(op.ptr(x), 1, 64); });
  s.recomputable_op("good2.forward", {x}, {y}, [&](const Session::op_scope& op) { (void)op.ptr(y); });
  s.end_iteration();
  ASSERT_EQ(s.recorded_trace().ops.size(), 2u);
  EXPECT_EQ(s.recorded_trace().ops[0].name, "good.forward");
}

TEST(SessionRecompute, ARerunWhoseInputWasOverwrittenSinceTheOpIsCaught) {
  // op 0 writes x; op 1 (recomputable) reads x, writes y; op 2 writes x again; op 3 reads x, y.
  // A plan that reruns op 1 before op 3 would not give op 1's bits: the executor refuses it.
  session_hooks hooks;
  hooks.edit_plan = [](const trace&, plan& p) { p.steps[3].recomputes.push_back(1); };
  Session s(config_for("none", 0), hooks);
  auto run = [&] {
    s.begin_iteration();
    auto x = s.add_transient("x", 256);
    auto y = s.add_transient("y", 256);
    { auto op = s.op("set.x", {}, {x}); op.run([&](const host_access& h) { std::memset(h.ptr(x), 1, 256); }); }
    s.recomputable_op("f.forward", {x}, {y}, [=](const Session::op_scope& op) {
      op.run([&](const host_access& h) { std::memcpy(h.ptr(y), h.ptr(x), 256); });
    });
    { auto op = s.op("set.x.again", {}, {x}); op.run([&](const host_access& h) { std::memset(h.ptr(x), 2, 256); }); }
    { auto op = s.op("use", {x, y}, {}); }
    s.release(x);
    s.release(y);
    s.end_iteration();
  };
  run();  // records
  try {
    run();
    ADD_FAILURE() << "the rerun was not refused";
  } catch (const usage_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("\"f.forward\""), std::string::npos) << m;
    EXPECT_NE(m.find("\"x\""), std::string::npos) << m;
    EXPECT_NE(m.find("written again"), std::string::npos) << m;
  }
}

// Note [Reruns on demand]: the plan drops y after op 0 and reruns op 0 before op 2, which reads
// it; an iteration that reads y on the host before op 2 departs from the trace after the drop,
// and op 0 runs again for that read.
TEST(SessionRecompute, AnIterationThatDepartsRunsTheDroppedValuesOpAgainForItsRead) {
  session_hooks hooks;
  hooks.edit_plan = [](const trace& t, plan& p) {
    if (t.ops.size() != 4) return;  // the recorded loop only, not the one that departs
    p.steps[0].evictions.push_back(eviction{0, evict_action::drop});
    p.steps[2].recomputes.push_back(0);
  };
  Session s(config_for("none", 0), hooks);
  auto run = [&](bool read_early) {
    s.begin_iteration();
    auto y = s.add_transient("y", 256);
    auto z = s.add_transient("z", 256);
    s.recomputable_op("gen.forward", {}, {y}, [=](const Session::op_scope& op) {
      op.run([&](const host_access& h) { std::memset(h.ptr(y), 7, 256); });
    });
    { auto op = s.op("other", {}, {z}); op.run([&](const host_access& h) { std::memset(h.ptr(z), 3, 256); }); }
    unsigned char got[256] = {};
    if (read_early) {
      s.read(y, got, 256);
      EXPECT_EQ(got[0], 7);
      EXPECT_EQ(got[255], 7);
    }
    { auto op = s.op("use", {y, z}, {}); }
    std::memset(got, 0, 256);
    s.read(y, got, 256);
    EXPECT_EQ(got[0], 7);
    s.release(y);
    s.release(z);
    s.end_iteration();
  };
  run(false);  // records
  run(false);  // follows: y is dropped and made again
  EXPECT_EQ(s.history().back().recomputes, 1u);
  ASSERT_NO_THROW(run(true));
  EXPECT_EQ(s.history().back().recomputes, 1u) << "op 0 ran again once, for the early read";
}

// A chain: z = f(y) with y released by the program after op 1; the plan drops z after op 1 and
// reruns ops 0 and 1 before op 3. An iteration that reads z on the host before op 3 remakes y
// (a released input) and then z.
TEST(SessionRecompute, AnIterationThatDepartsRemakesAReleasedInputOfTheDroppedValuesOp) {
  session_hooks hooks;
  hooks.edit_plan = [](const trace& t, plan& p) {
    if (t.ops.size() != 5) return;
    p.steps[1].evictions.push_back(eviction{1, evict_action::drop});
    p.steps[3].recomputes = {0, 1};
  };
  Session s(config_for("none", 0), hooks);
  auto run = [&](bool read_early) {
    s.begin_iteration();
    auto y = s.add_transient("y", 256);
    auto z = s.add_transient("z", 256);
    auto w = s.add_transient("w", 256);
    s.recomputable_op("gen.forward", {}, {y}, [=](const Session::op_scope& op) {
      op.run([&](const host_access& h) { std::memset(h.ptr(y), 7, 256); });
    });
    s.recomputable_op("f.forward", {y}, {z}, [=](const Session::op_scope& op) {
      op.run([&](const host_access& h) {
        for (int i = 0; i < 256; ++i) h.ptr<unsigned char>(z)[i] = static_cast<unsigned char>(h.ptr<unsigned char>(y)[i] + i);
      });
    });
    s.release(y);
    { auto op = s.op("other", {}, {w}); op.run([&](const host_access& h) { std::memset(h.ptr(w), 3, 256); }); }
    unsigned char got[256] = {};
    if (read_early) {
      s.read(z, got, 256);
      for (int i = 0; i < 256; ++i) ASSERT_EQ(got[i], static_cast<unsigned char>(7 + i)) << i;
    }
    { auto op = s.op("use", {z, w}, {}); }
    std::memset(got, 0, 256);
    s.read(z, got, 256);
    EXPECT_EQ(got[5], 12);
    s.release(z);
    s.release(w);
    s.end_iteration();
  };
  run(false);  // records: gen, f, other, use, host read z, and nothing else
  run(false);  // follows: z is dropped, y released, both made again before "use"
  EXPECT_EQ(s.history().back().recomputes, 2u);
  ASSERT_NO_THROW(run(true));
  EXPECT_EQ(s.history().back().recomputes, 2u) << "ops 0 and 1 ran again once each, for the early read";
}
