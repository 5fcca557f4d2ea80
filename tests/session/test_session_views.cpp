// Views: a loop that keeps its parameters and gradients in flat buffers addressed by offsets
// names a view per layer; ops name views (a layer's forward) or whole parents (an optimizer step
// over the flat buffer). Integer arithmetic, so every policy and budget must give the bits of the
// same loop on plain host arrays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/session_hooks.hpp"
#include "offload/swap_policy.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr int layers = 4;
constexpr std::size_t words = 16384;  // 64 KiB per layer
constexpr std::uint64_t layer_bytes = words * sizeof(std::uint32_t);
constexpr std::uint64_t flat_bytes = layers * layer_bytes;

session_config config_for(const std::string& policy, std::uint64_t budget) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.policy = policy;
  c.device_budget = budget;
  return c;
}

std::vector<std::uint32_t> initial_w() {
  std::vector<std::uint32_t> w(layers * words);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::uint32_t>(i * 2654435761u);
  return w;
}

// The plain loop's layer code: it sees pointers and counts only.
void forward(const std::uint32_t* w, std::uint32_t* a, std::uint32_t step) {
  for (std::size_t i = 0; i < words; ++i) a[i] = (w[i] >> 3) + step;
}
void backward(const std::uint32_t* a, std::uint32_t* g) {
  for (std::size_t i = 0; i < words; ++i) g[i] += a[i] ^ 0x5bd1e995u;
}
void update(std::uint32_t* w, const std::uint32_t* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) w[i] += g[i] >> 5;
}

/// The loop on host arrays: zero the gradients, forward and backward per layer, update the flat
/// buffer at once. Returns w after `steps`.
std::vector<std::uint32_t> plain(int steps) {
  auto w = initial_w();
  std::vector<std::uint32_t> g(w.size()), a(words);
  for (int s = 1; s <= steps; ++s) {
    std::fill(g.begin(), g.end(), 0u);
    for (int l = 0; l < layers; ++l) {
      forward(w.data() + l * words, a.data(), static_cast<std::uint32_t>(s));
      backward(a.data(), g.data() + l * words);
    }
    update(w.data(), g.data(), w.size());
  }
  return w;
}

/// The same loop on a Session: flat W and G with a view per layer; forward and backward name
/// views and run the layer code through op.run; the update names the whole flat buffers when
/// `whole_update`, else one op per view.
std::vector<std::uint32_t> wrapped(Session& s, int steps, bool whole_update) {
  const auto init = initial_w();
  auto W = s.add_persistent("W", flat_bytes, tensor_kind::parameter, init.data());
  auto G = s.add_persistent("G", flat_bytes, tensor_kind::gradient);
  std::vector<tensor_handle> wv, gv;
  for (int l = 0; l < layers; ++l) {
    wv.push_back(s.add_view(W, l * layer_bytes, layer_bytes, "w" + std::to_string(l)));
    gv.push_back(s.add_view(G, l * layer_bytes, layer_bytes));
  }
  for (int step = 1; step <= steps; ++step) {
    s.begin_iteration();
    for (int l = 0; l < layers; ++l) {
      auto a = s.add_transient("a" + std::to_string(l), layer_bytes);
      {
        auto op = s.op("fwd" + std::to_string(l), {wv[l]}, {a});
        op.run([&](const auto& h) { forward(h.template ptr<std::uint32_t>(wv[l]), h.template ptr<std::uint32_t>(a), step); });
      }
      {
        auto op = s.op("bwd" + std::to_string(l), {a}, {}, {gv[l]});
        op.run([&](const auto& h) { backward(h.template ptr<std::uint32_t>(a), h.template ptr<std::uint32_t>(gv[l])); });
      }
      s.release(a);
    }
    if (whole_update) {
      auto op = s.op("sgd", {W, G}, {W});
      op.run([&](const auto& h) { update(h.template ptr<std::uint32_t>(W), h.template ptr<std::uint32_t>(G), layers * words); });
    } else {
      for (int l = 0; l < layers; ++l) {
        auto op = s.op("sgd" + std::to_string(l), {wv[l], gv[l]}, {wv[l]});
        op.run([&](const auto& h) { update(h.template ptr<std::uint32_t>(wv[l]), h.template ptr<std::uint32_t>(gv[l]), words); });
      }
    }
    (void)s.end_iteration();
  }
  std::vector<std::uint32_t> out(layers * words);
  s.read(W, out.data(), flat_bytes);
  return out;
}

}  // namespace

TEST(SessionViews, PerViewOpsAtEveryPolicyAndABudgetBelowOneFlatBufferGiveThePlainLoopsBits) {
  const auto want = plain(4);
  // Per step live at once: a layer's w, g and activation (3 x 64 KiB): the flat buffers (512 KiB)
  // never need to be resident together, so a budget below one of them works.
  for (const char* policy : {"none", "lms", "vdnn", "auto"}) {
    for (std::uint64_t budget : {std::uint64_t{0}, 224_KiB}) {
      Session s(config_for(policy, budget));
      EXPECT_EQ(wrapped(s, 4, false), want) << policy << " at " << budget;
      if (budget != 0) {
        EXPECT_LE(s.history().back().peak_device_bytes, budget);
        if (std::string(policy) != "none") {
          EXPECT_GT(s.history().back().h2d_bytes, 0u) << policy;
        }
      }
    }
  }
}

TEST(SessionViews, AnOpOverTheWholeParentSeesOneContiguousBufferAndWritesReachTheViews) {
  const auto want = plain(3);
  for (const char* policy : {"none", "lms", "auto"}) {
    Session s(config_for(policy, 0));
    EXPECT_EQ(wrapped(s, 3, true), want) << policy;
    // The least budget counts the gathered copy: W and G's pieces and their copies (4 x 256 KiB).
    EXPECT_GE(s.least_budget_bytes(), 4 * flat_bytes);
    // A quarter above that lower bound: room for the pieces to sit apart from the copies.
    const std::uint64_t budget = s.least_budget_bytes() / 4 * 5;
    Session t(config_for(policy, budget));
    EXPECT_EQ(wrapped(t, 3, true), want) << policy << " near the least budget";
    EXPECT_LE(t.history().back().peak_device_bytes, budget);
  }
}

TEST(SessionViews, TheTraceSeesPiecesNotTheParent) {
  Session s(config_for("none", 0));
  (void)wrapped(s, 1, false);
  const trace& t = s.recorded_trace();
  ASSERT_TRUE(t.find_tensor("w2").has_value());
  ASSERT_TRUE(t.find_tensor("G[131072:196608]").has_value()) << "a view's default name";
  const auto w2 = *t.find_tensor("w2");
  const auto W = *t.find_tensor("W");
  bool w2_used = false;
  for (const auto& op : t.ops) {
    for (auto id : op.reads) EXPECT_NE(id, W) << op.name << " names the parent, not a piece";
    if (op.name == "fwd2") w2_used = std::find(op.reads.begin(), op.reads.end(), w2) != op.reads.end();
  }
  EXPECT_TRUE(w2_used);
}

TEST(SessionViews, BytesOutsideEveryViewKeepTheirValuesAndReadAssemblesTheParent) {
  Session s(config_for("lms", 0));
  std::vector<std::uint8_t> init(1000);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = static_cast<std::uint8_t>(i * 7);
  auto P = s.add_persistent("P", init.size(), tensor_kind::parameter, init.data());
  auto v = s.add_view(P, 100, 200);
  auto u = s.add_view(P, 600, 50);
  for (int it = 0; it < 3; ++it) {
    s.begin_iteration();
    {
      auto op = s.op("bump", {v, u}, {v, u});
      op.run([&](const auto& h) {
        for (int i = 0; i < 200; ++i) h.template ptr<std::uint8_t>(v)[i] += 1;
        for (int i = 0; i < 50; ++i) h.template ptr<std::uint8_t>(u)[i] += 2;
      });
    }
    (void)s.end_iteration();
  }
  std::vector<std::uint8_t> got(init.size()), view(200);
  s.read(P, got.data(), got.size());
  s.read(v, view.data(), view.size());
  for (std::size_t i = 0; i < init.size(); ++i) {
    const std::uint8_t bump = (i >= 100 && i < 300) ? 3 : (i >= 600 && i < 650) ? 6 : 0;
    ASSERT_EQ(got[i], static_cast<std::uint8_t>(init[i] + bump)) << "byte " << i;
  }
  EXPECT_EQ(0, std::memcmp(view.data(), got.data() + 100, 200));
}

TEST(SessionViews, AccumulatingIntoTheParentZeroFillsEveryPiece) {
  Session s(config_for("none", 0));
  std::vector<std::uint32_t> ones(64, 1);
  auto G = s.add_persistent("G", 64 * sizeof(std::uint32_t), tensor_kind::gradient, ones.data());
  auto half = s.add_view(G, 0, 32 * sizeof(std::uint32_t));
  for (int it = 0; it < 2; ++it) {
    s.begin_iteration();
    {
      auto op = s.op("bwd", {}, {}, {G});
      op.run([&](const auto& h) {
        for (int i = 0; i < 64; ++i) h.template ptr<std::uint32_t>(G)[i] += static_cast<std::uint32_t>(i);
      });
    }
    {
      auto op = s.op("bwd.half", {}, {}, {half});
      op.run([&](const auto& h) {
        for (int i = 0; i < 32; ++i) h.template ptr<std::uint32_t>(half)[i] += 1000;
      });
    }
    std::vector<std::uint32_t> got(64);
    s.read(G, got.data(), 64 * sizeof(std::uint32_t));
    for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], static_cast<std::uint32_t>(i + (i < 32 ? 1000 : 0))) << it << " " << i;
    (void)s.end_iteration();
  }
}

TEST(SessionViews, MisuseIsRefusedNamingTheTensors) {
  Session s(config_for("none", 0));
  auto P = s.add_persistent("P", 1000, tensor_kind::parameter);
  auto v = s.add_view(P, 0, 100, "head");
  auto expect = [](auto f, const char* want) {
    try {
      f();
      ADD_FAILURE() << "no error; wanted one saying " << want;
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect([&] { (void)s.add_view(P, 50, 100); }, "overlaps view \"head\"");
  expect([&] { (void)s.add_view(P, 900, 200); }, "offset + bytes <= 1000");
  expect([&] { (void)s.add_view(P, 500, 0); }, "0 bytes");
  expect([&] { (void)s.add_view(v, 0, 10); }, "itself a view");
  expect([&] { (void)s.add_view(P, 200, 10, "head"); }, "taken");
  s.begin_iteration();
  auto a = s.add_transient("a", 100);
  expect([&] { (void)s.add_view(P, 200, 10); }, "inside an iteration");
  expect([&] { auto op = s.op("both", {P, v}, {a}); }, "names both \"P\" and its view \"head\"");
  {
    auto op = s.op("w", {}, {a});
    expect([&] { op.run([&](const auto& h) { (void)h.ptr(P); }); }, "does not name");
  }
  s.release(a);
  (void)s.end_iteration();
  expect([&] { (void)s.add_view(P, 200, 10); }, "used already");
}

// A refused view left the parent split in one piece: every op naming it then paid a gather, and a
// checkpoint saved after it did not load into the same program without the failed call.
TEST(SessionViews, ARefusedViewLeavesItsParentWhole) {
  Session s(config_for("none", 0));
  std::vector<std::uint8_t> init(64, 5);
  auto W = s.add_persistent("W", init.size(), tensor_kind::parameter, init.data());
  (void)s.add_persistent("other", 8, tensor_kind::parameter);
  EXPECT_THROW((void)s.add_view(W, 0, 8, "other"), config_error);  // the name is taken
  s.begin_iteration();
  { auto op = s.op("use", {W}, {}); }
  (void)s.end_iteration();
  const trace& t = s.recorded_trace();
  EXPECT_TRUE(t.find_tensor("W").has_value()) << "W was split by a view that was refused";
  EXPECT_FALSE(t.find_tensor("W[0:64]").has_value());
  std::vector<std::uint8_t> got(init.size());
  s.read(W, got.data(), got.size());
  EXPECT_EQ(got, init);
}

TEST(SessionHostRun, StagedRunsAsOnAGpuGiveTheSameBitsAndCopyBackOnlyWhatTheOpWrites) {
  session_hooks staged;
  staged.stage_host_runs = true;
  Session s(config_for("lms", 224_KiB), staged);
  EXPECT_EQ(wrapped(s, 3, false), plain(3));

  Session t(config_for("none", 0), staged);
  std::uint32_t init = 7;
  auto x = t.add_persistent("x", sizeof init, tensor_kind::parameter, &init);
  auto y = t.add_persistent("y", sizeof init, tensor_kind::parameter, &init);
  t.begin_iteration();
  {
    auto op = t.op("scribble", {x}, {y});
    op.run([&](const auto& h) {
      *h.template ptr<std::uint32_t>(x) = 100;  // read-only: must not reach the device
      *h.template ptr<std::uint32_t>(y) = 200;
    });
  }
  (void)t.end_iteration();
  std::uint32_t got = 0;
  t.read(x, &got, sizeof got);
  EXPECT_EQ(got, 7u);
  t.read(y, &got, sizeof got);
  EXPECT_EQ(got, 200u);
}

TEST(SessionHostRun, RunsInStreamOrderAfterTheOpsKernels) {
  // Staged as on a GPU too: a tensor the op only writes holds, in f, what the op's kernels wrote.
  for (bool stage : {false, true}) {
    session_hooks h;
    h.stage_host_runs = stage;
    Session s(config_for("none", 0), h);
    auto x = s.add_persistent("x", sizeof(std::uint64_t), tensor_kind::parameter);
    s.begin_iteration();
    {
      auto op = s.op("set", {}, {x});
      auto* p = op.ptr<std::uint64_t>(x);
      op.device().launch_kernel(op.stream(), [p] { *p = 41; });  // queued, maybe not yet run
      std::uint64_t seen = 0;
      op.run([&](const auto& a) { seen = ++*a.template ptr<std::uint64_t>(x); });
      EXPECT_EQ(seen, 42u) << (stage ? "staged" : "unstaged");
    }
    (void)s.end_iteration();
    std::uint64_t got = 0;
    s.read(x, &got, sizeof got);
    EXPECT_EQ(got, 42u) << (stage ? "staged" : "unstaged");
  }
}

TEST(SessionHostRun, AnExceptionFromTheFunctionReachesTheCallerOnEitherPath) {
  for (bool stage : {false, true}) {
    session_hooks h;
    h.stage_host_runs = stage;
    Session s(config_for("none", 0), h);
    auto x = s.add_persistent("x", 8, tensor_kind::parameter);
    s.begin_iteration();
    {
      auto op = s.op("boom", {x}, {x});
      EXPECT_THROW(op.run([](const auto&) { throw std::runtime_error("from f"); }), std::runtime_error);
    }
    (void)s.end_iteration();
  }
}
