// Ops with a host implementation (Session::host_capable_op): the optimizer step of a small loop
// given a device body and a host body, placed by the plan. Integer arithmetic, so every policy,
// budget and placement must give the bits of the same loop on plain host arrays; and where the
// step runs on the host, its optimizer state never crosses the link.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/session_hooks.hpp"
#include "offload/swap_policy.hpp"
#include "../swap/swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr int layers = 5;
constexpr std::size_t words = 16384;  // 64 KiB per tensor
constexpr std::uint64_t bytes = words * sizeof(std::uint32_t);
using vec = std::vector<std::uint32_t>;

session_config config_for(const std::string& policy, std::uint64_t budget, const std::string& host_ops) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.policy = policy;
  c.device_budget = budget;
  c.host_ops = host_ops;
  c.link_gbps = 8;
  return c;
}

void forward(const std::uint32_t* w, const std::uint32_t* a, std::uint32_t* out) {
  for (std::size_t i = 0; i < words; ++i) out[i] = (a[i] * 3u + w[i]) ^ (a[i] >> 3);
}
void backward(const std::uint32_t* a, const std::uint32_t* w, const std::uint32_t* d_out, std::uint32_t* d_in,
              std::uint32_t* g) {
  for (std::size_t i = 0; i < words; ++i) {
    g[i] += d_out[i] ^ a[i];
    d_in[i] = d_out[i] * 5u + w[i];
  }
}
// The step: a moment only it touches, and the weight the forward pass reads.
void step(std::uint32_t* w, std::uint32_t* m, const std::uint32_t* g) {
  for (std::size_t i = 0; i < words; ++i) {
    m[i] = m[i] * 3u + g[i];
    w[i] += (g[i] >> 5) + (m[i] >> 9);
  }
}
std::uint32_t loss_of(const std::uint32_t* a) {
  std::uint32_t s = 0;
  for (std::size_t i = 0; i < words; ++i) s = s * 31u + a[i];
  return s;
}
vec initial_w(int l) {
  vec w(words);
  for (std::size_t i = 0; i < words; ++i) w[i] = static_cast<std::uint32_t>((i + 11 * l) * 40503u);
  return w;
}
vec input_of(int s) {
  vec a(words);
  for (std::size_t i = 0; i < words; ++i) a[i] = static_cast<std::uint32_t>(i * 2654435761u) + static_cast<std::uint32_t>(s);
  return a;
}

struct result {
  std::vector<std::uint32_t> losses;
  std::vector<vec> w, m;
  bool operator==(const result&) const = default;
};

result plain(int steps) {
  result r;
  for (int l = 0; l < layers; ++l) {
    r.w.push_back(initial_w(l));
    r.m.emplace_back(words, 0u);
  }
  std::vector<vec> a(layers + 1, vec(words)), g(layers, vec(words));
  vec d(words), d_in(words);
  for (int s = 1; s <= steps; ++s) {
    a[0] = input_of(s);
    for (int l = 0; l < layers; ++l) forward(r.w[l].data(), a[l].data(), a[l + 1].data());
    r.losses.push_back(loss_of(a[layers].data()));
    d = a[layers];
    for (int l = layers - 1; l >= 0; --l) {
      std::fill(g[l].begin(), g[l].end(), 0u);
      backward(a[l].data(), r.w[l].data(), d.data(), d_in.data(), g[l].data());
      std::swap(d, d_in);
    }
    for (int l = 0; l < layers; ++l) step(r.w[l].data(), r.m[l].data(), g[l].data());
  }
  return r;
}

struct counts {
  int host = 0;    // host bodies run
  int device = 0;  // device bodies run
};

/// The loop on a Session, its steps host-capable. From step `plain_from` on, the steps are plain
/// op()s (a change of the trace). `fail_at`: the host body of that step throws.
result wrapped(Session& s, int steps, counts& n, int plain_from = 1 << 30, int fail_at = -1) {
  std::vector<tensor_handle> W, G, M;
  for (int l = 0; l < layers; ++l) {
    const auto init = initial_w(l);
    W.push_back(s.add_persistent("w" + std::to_string(l), bytes, tensor_kind::parameter, init.data()));
    G.push_back(s.add_persistent("g" + std::to_string(l), bytes, tensor_kind::gradient));
    M.push_back(s.add_persistent("m" + std::to_string(l), bytes, tensor_kind::optimizer_state));
  }
  result r;
  for (int it = 1; it <= steps; ++it) {
    s.begin_iteration();
    std::vector<tensor_handle> a;
    a.push_back(s.add_transient("a0", bytes));
    {
      auto op = s.op("input.forward", {}, {a[0]});
      const auto in = input_of(it);
      op.run([&](const host_access& x) { std::memcpy(x.ptr(a[0]), in.data(), bytes); });
    }
    for (int l = 0; l < layers; ++l) {
      a.push_back(s.add_transient("a" + std::to_string(l + 1), bytes));
      auto op = s.op("l" + std::to_string(l) + ".forward", {W[l], a[l]}, {a[l + 1]});
      op.run([&](const host_access& x) {
        forward(x.ptr<std::uint32_t>(W[l]), x.ptr<std::uint32_t>(a[l]), x.ptr<std::uint32_t>(a[l + 1]));
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
      op.run([&](const host_access& x) { std::memcpy(x.ptr(d), x.ptr(a[layers]), bytes); });
    }
    s.release(a[layers]);
    for (int l = layers - 1; l >= 0; --l) {
      auto d_in = s.add_transient("d" + std::to_string(l), bytes);
      {
        auto op = s.op("l" + std::to_string(l) + ".backward", {a[l], W[l], d}, {d_in}, {G[l]});
        op.run([&](const host_access& x) {
          backward(x.ptr<std::uint32_t>(a[l]), x.ptr<std::uint32_t>(W[l]), x.ptr<std::uint32_t>(d),
                   x.ptr<std::uint32_t>(d_in), x.ptr<std::uint32_t>(G[l]));
        });
      }
      s.release(d);
      s.release(a[l]);
      d = d_in;
    }
    s.release(d);
    for (int l = 0; l < layers; ++l) {
      const std::string name = "l" + std::to_string(l) + ".adam";
      auto on_device = [&](const Session::op_scope& op) {
        ++n.device;
        op.run([&](const host_access& x) {
          step(x.ptr<std::uint32_t>(W[l]), x.ptr<std::uint32_t>(M[l]), x.ptr<std::uint32_t>(G[l]));
        });
      };
      if (it >= plain_from) {
        on_device(s.op(name, {W[l], M[l], G[l]}, {W[l], M[l]}));
        continue;
      }
      s.host_capable_op(name, {W[l], M[l], G[l]}, {W[l], M[l]}, on_device, [&](const host_access& x) {
        ++n.host;
        if (it == fail_at) throw std::runtime_error("host step failed");
        step(x.ptr<std::uint32_t>(W[l]), x.ptr<std::uint32_t>(M[l]), x.ptr<std::uint32_t>(G[l]));
      });
    }
    s.end_iteration();
  }
  for (int l = 0; l < layers; ++l) {
    r.w.emplace_back(words);
    s.read(W[l], r.w.back().data(), bytes);
    r.m.emplace_back(words);
    s.read(M[l], r.m.back().data(), bytes);
  }
  return r;
}

struct probe_sizes {
  std::uint64_t footprint = 0, least = 0;
};
probe_sizes probe() {
  Session s(config_for("none", 0, "device"));
  counts n;
  (void)wrapped(s, 1, n);
  return {s.footprint_bytes(), s.least_budget_bytes()};
}

}  // namespace

TEST(SessionHostOps, EveryPolicyBudgetAndPlacementGivesThePlainLoopsBits) {
  const auto want = plain(4);
  const auto sizes = probe();
  ASSERT_GT(sizes.footprint, 0u);
  int host_runs = 0, laid_out = 0;
  for (const char* host_ops : {"host", "auto", "device"}) {
    for (const char* policy : {"none", "lms", "vdnn", "auto", "checkpoint", "capuchin", "zero-offload"}) {
      for (const std::uint64_t budget : {std::uint64_t{0}, sizes.footprint / 2, sizes.least + sizes.least / 4}) {
        if (budget != 0 && budget < sizes.least) continue;
        const std::string where = std::string(policy) + " at " + std::to_string(budget) + ", host_ops " + host_ops;
        Session s(config_for(policy, budget, host_ops));
        counts n;
        EXPECT_EQ(wrapped(s, 4, n), want) << where;
        const auto& last = s.history().back();
        EXPECT_TRUE(last.planned) << where;
        if (budget != 0) {
          EXPECT_LE(last.peak_device_bytes, budget) << where;
        }
        ASSERT_NE(s.current_plan(), nullptr);
        EXPECT_EQ(last.host_ops, s.current_plan()->host_op_count()) << where;
        // Each iteration runs the host bodies its plan placed there. With host_ops "auto" the
        // placement follows measured times, so a plan made again mid-run may place more or fewer.
        std::uint64_t placed = 0;
        for (const auto& h : s.history()) placed += h.host_ops;
        EXPECT_EQ(n.host, static_cast<int>(placed)) << where;
        if (std::string(host_ops) != "auto") {
          EXPECT_EQ(n.host, static_cast<int>(3 * s.current_plan()->host_op_count())) << where;
        }
        host_runs += n.host;
        if (std::string(host_ops) == "host") {
          EXPECT_EQ(last.host_ops, static_cast<std::uint64_t>(layers)) << where;
        }
        // Nothing missed where the device holds everything, or where auto judged the plan.
        if (budget == 0 || std::string(policy) == "auto") {
          EXPECT_EQ(last.on_demand_fetches, 0u) << where;
        }
        if (std::string(host_ops) == "device") {
          EXPECT_EQ(last.host_ops, 0u) << where;
        }
        // A plan with host ops packs into the budget like any other: the host ops place nothing
        // on the device (Note [Host ops in the executor]), so the layout holds none of their
        // tensors, and the executor follows it (auto's plans always; the others' where their
        // packing fits the budget).
        if (budget != 0 && last.host_ops > 0) {
          if (std::string(policy) == "auto") {
            EXPECT_TRUE(last.layout) << where;
          }
          if (last.layout) {
            EXPECT_EQ(last.layout_misses, 0u) << where;
          }
          laid_out += last.layout;
        }
      }
    }
  }
  EXPECT_GT(host_runs, 0);
  EXPECT_GT(laid_out, 0);
}

TEST(SessionHostOps, OnTheHostTheOptimizerStateNeverCrossesTheLink) {
  const auto sizes = probe();
  for (const char* policy : {"none", "lms", "auto"}) {
    Session on_host(config_for(policy, sizes.footprint / 2, "host"));
    Session on_device(config_for(policy, sizes.footprint / 2, "device"));
    counts a, b;
    EXPECT_EQ(wrapped(on_host, 3, a), wrapped(on_device, 3, b)) << policy;
    const auto& h = on_host.history().back();
    const auto& d = on_device.history().back();
    // Per step: each gradient down and each weight up, and nothing of the moments.
    const trace& t = on_host.recorded_trace();
    const plan& p = *on_host.current_plan();
    for (tensor_id x = 0; x < t.tensors.size(); ++x) {
      if (t.tensors[x].kind != tensor_kind::optimizer_state) continue;
      EXPECT_EQ(p.initial_tier[x], tier::host) << t.tensors[x].name;
      for (const auto& st : p.steps)
        for (const auto& f : st.prefetches) EXPECT_NE(f.tensor, x) << t.tensors[x].name << " is prefetched";
    }
    EXPECT_GE(h.d2h_bytes, layers * bytes) << policy;
    EXPECT_GE(h.h2d_bytes, layers * bytes) << policy;
    EXPECT_LT(h.h2d_bytes + h.d2h_bytes, d.h2d_bytes + d.d2h_bytes + 2 * layers * bytes) << policy;
    EXPECT_GT(h.host_op_ms, 0.0) << policy;
    EXPECT_GT(h.host_op_wait_ms, 0.0) << policy;
    EXPECT_EQ(h.host_ops, static_cast<std::uint64_t>(layers)) << policy;
  }
}

// A host step waits for its gradient's copy out; on a slow link that wait is long, and it is
// the host op's (host_op_wait_ms), not a stall of the device's work (stall_ms), which counts
// only waits for copies the plan did not hide: here the weights' copies up at the next step.
TEST(SessionHostOps, AHostStepsWaitForItsInputsIsNotAStall) {
  auto c = config_for("none", 0, "host");
  c.link_gbps = 0.02;  // 64 KiB in 3.3 ms each way
  Session s(c);
  counts n;
  EXPECT_EQ(wrapped(s, 3, n), plain(3));
  const auto& h = s.history().back();
  ASSERT_EQ(h.host_ops, static_cast<std::uint64_t>(layers));
  // Each step waits for its own gradient's copy out, after the one before it ran.
  EXPECT_GE(h.host_op_wait_ms, 3.0);
  EXPECT_LE(h.stall_ms + h.host_op_wait_ms + h.host_op_ms, h.step_ms * 1.05 + 1.0);
}

TEST(SessionHostOps, AGradientThePlanLeavesOnTheDeviceIsCopiedOutFirst) {
  // A plan edited to keep every gradient on the device after the backward pass: the host step
  // must wait for a copy out made on demand, and still get the bits.
  session_hooks hooks;
  hooks.edit_plan = [](const trace& t, plan& p) {
    for (auto& st : p.steps)
      std::erase_if(st.evictions, [&](const eviction& e) { return t.tensors[e.tensor].kind == tensor_kind::gradient; });
  };
  Session s(config_for("none", 0, "host"), hooks);
  counts n;
  EXPECT_EQ(wrapped(s, 3, n), plain(3));
  EXPECT_EQ(s.history().back().host_ops, static_cast<std::uint64_t>(layers));
  EXPECT_GE(s.history().back().on_demand_evictions, static_cast<std::uint64_t>(layers));
}

TEST(SessionHostOps, APlainOpWhereThePlanHasAHostOpIsADepartureWithTheSameBits) {
  Session s(config_for("lms", 0, "host"));
  counts n;
  EXPECT_EQ(wrapped(s, 5, n, /*plain_from=*/3), plain(5));
  ASSERT_GE(s.history().size(), 5u);
  EXPECT_EQ(s.history()[1].host_ops, static_cast<std::uint64_t>(layers));  // step 2 followed the plan
  EXPECT_FALSE(s.history()[2].planned);  // step 3 departed: on demand, recorded again
  EXPECT_EQ(s.history()[2].host_ops, 0u);
  EXPECT_TRUE(s.history()[4].planned);
  EXPECT_FALSE(s.recorded_trace().ops.back().host_capable);
}

TEST(SessionHostOps, AHostBodysExceptionReachesTheCaller) {
  Session s(config_for("none", 0, "host"));
  counts n;
  EXPECT_THROW(
      {
        try {
          (void)wrapped(s, 3, n, 1 << 30, /*fail_at=*/2);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "host step failed");
          throw;
        }
      },
      std::runtime_error);
}

TEST(SessionHostOps, BadInputIsRefusedBeforeAnyWork) {
  session_config c = config_for("none", 0, "gpu");
  try {
    Session s(c);
    FAIL() << "host_ops \"gpu\" was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("host_ops"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, host, device"), std::string::npos) << e.what();
  }
  Session s(config_for("none", 0, "auto"));
  auto parent = s.add_persistent("flat", 2 * bytes, tensor_kind::parameter);
  auto v0 = s.add_view(parent, 0, bytes);
  (void)v0;
  auto g = s.add_persistent("g", bytes, tensor_kind::gradient);
  s.begin_iteration();
  const Session::op_body dev = [](const Session::op_scope&) {};
  const Session::host_body host = [](const host_access&) {};
  try {
    s.host_capable_op("step", {parent, g}, {parent}, dev, host);
    FAIL() << "a split parent was accepted";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"flat\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("names the views it uses"), std::string::npos) << e.what();
  }
  try {
    s.host_capable_op("step", {g}, {g}, dev, Session::host_body{});
    FAIL() << "a missing host body was accepted";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("both a device body and a host body"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(s.end_iteration().iteration == 1);
}

TEST(SessionHostOps, TheChromeTraceHasAHostTrack) {
  test::temp_dir dir;  // a fresh one: a file another run or user left there cannot be in the way
  const std::string path = dir.path() + "/host_ops_trace.json";
  session_config c = config_for("lms", 0, "host");
  c.chrome_trace = path;
  {
    Session s(c);
    counts n;
    (void)wrapped(s, 3, n);
    s.write_chrome_trace(path);
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"host ops\""), std::string::npos);
  EXPECT_NE(text.str().find("l0.adam"), std::string::npos);
}

// The host tier a plan is judged to fit is all it takes: at host budgets just above what the
// persistent tensors need, every policy that keeps its budget runs the plain loop's bits. Before,
// copies the device held again and dead gradients' copies stayed in the tier, and zero-offload and
// auto ran out of it in the second iteration.
TEST(SessionHostOps, AHostBudgetThePlanFitsIsEnough) {
  const auto want = plain(3);
  const auto sizes = probe();
  int ran = 0;
  for (const char* host_ops : {"host", "device"}) {
    for (const char* policy : {"lms", "auto", "checkpoint", "capuchin", "zero-offload"}) {
      for (int blocks : {15, 16, 20}) {
        const std::string where = std::string(policy) + ", host_ops " + host_ops + ", host budget " +
                                  std::to_string(blocks) + " x 64 KiB";
        auto c = config_for(policy, sizes.footprint / 2, host_ops);
        c.host_budget = static_cast<std::uint64_t>(blocks) * bytes;
        Session s(c);
        counts n;
        result got;
        try {
          got = wrapped(s, 3, n);
        } catch (const config_error& e) {
          // Refused as the plan is made is fine; running out in the middle of an iteration is not.
          EXPECT_EQ(s.history().size(), 1u) << where << ": " << e.what();
          EXPECT_NE(std::string(e.what()).find("host_budget"), std::string::npos) << where << ": " << e.what();
          continue;
        } catch (const std::exception& e) {
          ADD_FAILURE() << where << ": " << e.what();
          continue;
        }
        EXPECT_EQ(got, want) << where;
        EXPECT_LE(s.history().back().peak_device_bytes, sizes.footprint / 2) << where;
        ++ran;
      }
    }
  }
  EXPECT_GE(ran, 25);
}

// The optimizer steps a plan runs on the host keep their tensors in the host tier, never on
// NVMe: a host budget below them is refused as the plan is made, saying what would fit. Kept on
// the device, the same steps run with their tensors on NVMe.
TEST(SessionHostOps, AHostBudgetBelowWhatTheHostStepsKeepIsRefusedWhenThePlanIsMade) {
  const auto want = plain(3);
  const auto sizes = probe();
  for (const char* policy : {"zero-offload", "auto"}) {
    test::temp_dir dir;
    auto c = config_for(policy, sizes.footprint / 2, "host");
    c.host_budget = 4_KiB;
    c.nvme.directories = {dir.path()};
    {
      Session s(c);
      counts n;
      std::string refused;
      try {
        (void)wrapped(s, 3, n);
      } catch (const config_error& e) {
        refused = e.what();
      }
      ASSERT_FALSE(refused.empty()) << policy << ": steps on the host were planned for a 4 KiB host tier";
      EXPECT_EQ(s.history().size(), 1u) << policy << ": the recording iteration ran, the plan was refused";
      EXPECT_NE(refused.find("host_budget: 4.00 KiB"), std::string::npos) << refused;
      EXPECT_NE(refused.find("give host_budget of at least"), std::string::npos) << refused;
      EXPECT_NE(refused.find("host_ops = device"), std::string::npos) << refused;
      EXPECT_EQ(refused.find("nvme.directories"), std::string::npos) << "NVMe is there already: " << refused;
    }
    c.host_ops = "device";
    Session s(c);
    counts n;
    EXPECT_EQ(wrapped(s, 3, n), want) << policy;
    EXPECT_EQ(s.history().back().host_ops, 0u) << policy;
    EXPECT_GT(s.history().back().nvme_write_bytes, 0u) << policy;
  }
}

// Without NVMe, a host budget below what the persistent tensors take is an error as they are
// added, before any iteration, that says what to change.
TEST(SessionHostOps, PersistentTensorsBeyondTheHostBudgetAreAnErrorThatSaysWhatToChange) {
  auto c = config_for("auto", probe().footprint / 2, "host");
  c.host_budget = 4 * bytes;
  Session s(c);
  counts n;
  try {
    (void)wrapped(s, 1, n);
    FAIL() << "15 tensors of 64 KiB were stored in a 256 KiB host tier";
  } catch (const out_of_memory& e) {
    EXPECT_TRUE(s.history().empty());
    EXPECT_NE(std::string(e.what()).find("capacity 256.00 KiB"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("give a larger host budget or an NVMe swap directory"), std::string::npos)
        << e.what();
  }
}
