// Tests of data parallel planning: ring costs, the rank-trace transform (ZeRO stages 1 and 2)
// and the simulator's network stream, by hand-worked timelines and over random models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "offload/data_parallel.hpp"
#include "offload/planner.hpp"
#include "offload/rank_planning.hpp"
#include "offload/simulator.hpp"
#include "offload/zoo.hpp"
#include "unit_hw.hpp"
#include "../test_seed.hpp"

namespace spillway::offload {
namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

TEST(RingCost, MovesNMinusOneOverNOfTheBufferEachWay) {
  EXPECT_EQ(ring_cost_of(collective_kind::reduce_scatter, 800, 1).wire_bytes, 0u);
  EXPECT_EQ(ring_cost_of(collective_kind::reduce_scatter, 800, 1).steps, 0u);
  const auto rs = ring_cost_of(collective_kind::reduce_scatter, 800, 8);
  EXPECT_EQ(rs.wire_bytes, 700u);
  EXPECT_EQ(rs.steps, 7u);
  const auto ag = ring_cost_of(collective_kind::all_gather, 801, 8);  // chunks of 101
  EXPECT_EQ(ag.wire_bytes, 707u);
  const auto ar = ring_cost_of(collective_kind::all_reduce, 800, 4);
  EXPECT_EQ(ar.wire_bytes, 1200u);
  EXPECT_EQ(ar.steps, 6u);
  EXPECT_EQ(parse_collective_kind("all_gather"), collective_kind::all_gather);
  EXPECT_FALSE(parse_collective_kind("broadcast"));
}

// A small mixed-precision model the way the zoo builds one: forward ops reading weights,
// backward ops writing (and accumulating) gradients, Adam per weight over fp32 state (in two
// chunks for every other weight).
struct model_params {
  tensor_id w, g, m, v, master;
};

trace random_model(std::mt19937_64& rng, bool clip, std::vector<model_params>* out = nullptr) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto secs = [&] { return std::uniform_real_distribution<double>(1e-4, 1e-3)(rng); };
  trace t;
  const int P = uni(1, 6), L = uni(2, 8);
  std::vector<model_params> ps;
  for (int i = 0; i < P; ++i) {
    const std::uint64_t b = static_cast<std::uint64_t>(uni(1, 50)) * 1000;
    const auto n = "w" + std::to_string(i);
    ps.push_back({t.add_tensor(n, b, tensor_kind::parameter), t.add_tensor(n + ".grad", b, tensor_kind::gradient),
                  t.add_tensor(n + ".m", 2 * b, tensor_kind::optimizer_state),
                  t.add_tensor(n + ".v", 2 * b, tensor_kind::optimizer_state),
                  t.add_tensor(n + ".master", 2 * b, tensor_kind::optimizer_state)});
  }
  auto op = [&](std::string name, std::vector<tensor_id> r, std::vector<tensor_id> w, op_phase ph) {
    op_desc o;
    o.name = std::move(name);
    o.reads = std::move(r);
    o.writes = std::move(w);
    o.phase = ph;
    o.measured_seconds = secs();
    return o;
  };
  std::vector<tensor_id> acts{t.add_tensor("x0", uni(1, 40) * 1000ull, tensor_kind::activation)};
  t.add_op(op("load", {}, {acts[0]}, op_phase::forward));
  std::vector<std::vector<int>> uses(L);
  for (int i = 0; i < P; ++i) uses[i % L].push_back(i);
  for (int l = 0; l < L; ++l) {
    if (uni(0, 2) == 0) {
      const int extra = uni(0, P - 1);
      if (std::find(uses[l].begin(), uses[l].end(), extra) == uses[l].end()) uses[l].push_back(extra);
    }
    std::vector<tensor_id> r{acts.back()};
    for (int i : uses[l]) r.push_back(ps[i].w);
    acts.push_back(t.add_tensor("x" + std::to_string(l + 1), uni(1, 40) * 1000ull, tensor_kind::activation));
    t.add_op(op("fwd" + std::to_string(l), r, {acts.back()}, op_phase::forward));
  }
  auto d = t.add_tensor("d" + std::to_string(L), t.tensors[acts.back()].bytes, tensor_kind::activation);
  t.add_op(op("loss", {acts.back()}, {d}, op_phase::forward));
  std::vector<char> grad_written(P, 0);
  for (int l = L - 1; l >= 0; --l) {
    std::vector<tensor_id> r{d, acts[l]}, w;
    for (int i : uses[l]) {
      r.push_back(ps[i].w);
      if (grad_written[i]) r.push_back(ps[i].g);  // accumulate
      w.push_back(ps[i].g);
      grad_written[i] = 1;
    }
    if (l > 0) {
      d = t.add_tensor("d" + std::to_string(l), t.tensors[acts[l]].bytes, tensor_kind::activation);
      w.push_back(d);
    }
    t.add_op(op("bwd" + std::to_string(l), r, w, op_phase::backward));
  }
  std::optional<tensor_id> norm;
  if (clip) {
    norm = t.add_tensor("grad_norm", 4, tensor_kind::activation);
    std::vector<tensor_id> r;
    for (const auto& p : ps) r.push_back(p.g);
    t.add_op(op("clip", r, {*norm}, op_phase::optimizer));
  }
  for (int i = 0; i < P; ++i) {
    const auto& p = ps[i];
    std::vector<tensor_id> r{p.w, p.g, p.m, p.v, p.master};
    if (norm) r.push_back(*norm);
    // Every other weight is stepped in two chunks, by two ops, as the examples step a large one.
    const int chunks = i % 2 == 1 ? 2 : 1;
    for (int c = 0; c < chunks; ++c) {
      auto o = op("adam.w" + std::to_string(i) + (chunks > 1 ? "." + std::to_string(c) : ""), r,
                  {p.w, p.m, p.v, p.master}, op_phase::optimizer);
      o.flops = 12.0 * static_cast<double>(t.tensors[p.w].bytes / 2) / chunks;
      o.host_capable = true;
      o.host_flops = o.flops;
      o.host_bytes = 14 * t.tensors[p.w].bytes / chunks;
      t.add_op(std::move(o));
    }
  }
  t.validate();
  if (out) *out = ps;
  return t;
}

TEST(DataParallel, OneRankIsThePlainTrace) {
  std::mt19937_64 rng(spillway::test::test_seed(1));
  const auto t = random_model(rng, true);
  const auto r = make_rank_trace(t, {.ranks = 1});
  EXPECT_EQ(r.comm.ranks, 1u);
  EXPECT_TRUE(r.comm.collectives.empty());
  ASSERT_EQ(r.t.ops.size(), t.ops.size());
  ASSERT_EQ(r.t.tensors.size(), t.tensors.size());
  for (std::size_t i = 0; i < t.tensors.size(); ++i) EXPECT_EQ(r.t.tensors[i].bytes, t.tensors[i].bytes);
}

TEST(DataParallel, StageTwoShardsTheOptimizerAndReduceScattersGradients) {
  std::mt19937_64 rng(spillway::test::test_seed(7));
  std::vector<model_params> ps;
  const auto t = random_model(rng, true, &ps);
  const std::uint32_t N = 4;
  const auto r = make_rank_trace(t, {.ranks = N, .bucket_bytes = 1ull << 40});
  std::uint64_t grad_bytes = 0, param_bytes = 0;
  for (const auto& p : ps) {
    grad_bytes += t.tensors[p.g].bytes;
    param_bytes += t.tensors[p.w].bytes;
    EXPECT_EQ(r.t.tensors[p.m].bytes, (t.tensors[p.m].bytes + N - 1) / N);
    EXPECT_EQ(r.t.tensors[p.master].bytes, (t.tensors[p.master].bytes + N - 1) / N);
    EXPECT_EQ(r.t.tensors[p.g].kind, tensor_kind::activation);  // a transient bucket now
    const auto gs = r.t.find_tensor(t.tensors[p.g].name + ".shard");
    const auto ws = r.t.find_tensor(t.tensors[p.w].name + ".shard");
    ASSERT_TRUE(gs && ws);
    EXPECT_EQ(r.t.tensors[*gs].kind, tensor_kind::gradient);
    EXPECT_EQ(r.t.tensors[*ws].bytes, (t.tensors[p.w].bytes + N - 1) / N);
  }
  // One bucket each way (the bucket holds everything) and the norm's all-reduce.
  ASSERT_EQ(r.comm.collectives.size(), 3u);
  int rs = 0, ag = 0, ar = 0;
  for (const auto& c : r.comm.collectives) {
    const auto& op = r.t.ops[c.op];
    EXPECT_EQ(op.category, "collective");
    if (c.kind == collective_kind::reduce_scatter) {
      ++rs;
      EXPECT_EQ(c.bytes, grad_bytes);
    } else if (c.kind == collective_kind::all_gather) {
      ++ag;
      EXPECT_EQ(c.bytes, param_bytes);
      EXPECT_LT(c.op, 2u);  // before_use: before the first forward op reads a weight
    } else {
      ++ar;
      EXPECT_EQ(c.bytes, 4u);
    }
  }
  EXPECT_EQ(rs + ag + ar, 3);
  // Adam runs over a quarter of the model.
  for (std::size_t k = 0; k < t.ops.size(); ++k) {
    if (t.ops[k].name.rfind("adam.", 0) != 0) continue;
    const auto it = std::find_if(r.t.ops.begin(), r.t.ops.end(), [&](const op_desc& o) { return o.name == t.ops[k].name; });
    ASSERT_NE(it, r.t.ops.end());
    EXPECT_DOUBLE_EQ(it->flops, t.ops[k].flops / N);
    EXPECT_DOUBLE_EQ(*it->measured_seconds, *t.ops[k].measured_seconds / N);
    EXPECT_EQ(it->host_bytes, (t.ops[k].host_bytes + N - 1) / N);
  }
}

TEST(DataParallel, BucketsAndPlacements) {
  std::mt19937_64 rng(spillway::test::test_seed(3));
  const auto t = random_model(rng, false);
  for (auto stage : {zero_stage::one, zero_stage::two})
    for (auto gather : {gather_placement::before_use, gather_placement::after_step}) {
      const auto r = make_rank_trace(t, {.ranks = 8, .stage = stage, .bucket_bytes = 1, .gather = gather, .gather_ahead = 1});
      // 1-byte buckets: each collective follows one op; every gradient is reduced once and every
      // weight gathered once.
      std::vector<int> reduced(t.tensors.size(), 0), gathered(t.tensors.size(), 0);
      for (const auto& c : r.comm.collectives) {
        const auto& op = r.t.ops[c.op];
        if (c.kind == collective_kind::all_gather) {
          for (tensor_id w : op.writes) ++gathered[w];
        } else {
          for (tensor_id g : op.reads) ++reduced[g];
        }
      }
      for (tensor_id x = 0; x < t.tensors.size(); ++x) {
        if (t.tensors[x].kind == tensor_kind::gradient) {
          EXPECT_EQ(reduced[x], 1) << t.tensors[x].name;
        }
        if (t.tensors[x].kind == tensor_kind::parameter) {
          EXPECT_EQ(gathered[x], 1) << t.tensors[x].name;
        }
      }
      for (const auto& c : r.comm.collectives) {
        if (c.kind != collective_kind::all_gather) {
          EXPECT_EQ(c.kind, stage == zero_stage::two ? collective_kind::reduce_scatter : collective_kind::all_reduce);
        } else if (gather == gather_placement::after_step) {
          EXPECT_EQ(r.t.ops[c.op].phase, op_phase::optimizer);
        }
      }
    }
}

// Every op that reads a gradient or parameter shard comes after the op that writes it (or the
// shard crosses the iteration boundary: a parameter shard the next iteration gathers).
void expect_shards_written_before_read(const rank_trace& r) {
  std::vector<char> written(r.t.tensors.size(), 0);
  for (const auto& op : r.t.ops) {
    for (tensor_id x : op.reads) {
      const auto& d = r.t.tensors[x];
      if (d.kind == tensor_kind::gradient && d.name.ends_with(".shard")) {
        EXPECT_TRUE(written[x]) << op.name << " reads " << d.name;
      }
    }
    for (tensor_id x : op.writes) written[x] = 1;
  }
}

TEST(DataParallel, EarlyStepsRunInTheBackwardPass) {
  std::mt19937_64 rng(spillway::test::test_seed(9));
  int moved = 0;
  // 30 models, more where fewer than 5 of them had steps to move (a seed's luck).
  for (int iter = 0; iter < 300 && (iter < 30 || moved < 5); ++iter) {
    const bool clip = iter % 3 == 0;
    const auto t = random_model(rng, clip);
    const auto lag = static_cast<std::uint32_t>(1 + iter % 3);
    const auto r = make_rank_trace(t, {.ranks = 4, .bucket_bytes = 1, .early_step_share = 1, .early_step_lag = lag});
    expect_shards_written_before_read(r);
    std::size_t last_backward = 0, first_step = r.t.ops.size(), reduces = 0;
    for (std::size_t k = 0; k < r.t.ops.size(); ++k) {
      const auto& op = r.t.ops[k];
      if (op.phase == op_phase::backward && op.category != "collective") last_backward = k;
      if (op.name.starts_with("adam.")) first_step = std::min(first_step, k);
    }
    for (const auto& c : r.comm.collectives) reduces += c.kind == collective_kind::reduce_scatter;
    if (clip) {
      EXPECT_GT(first_step, last_backward) << "a step needs the norm of every gradient: none moves";
    } else if (reduces > lag + 1) {  // the last bucket follows the last backward op
      EXPECT_LT(first_step, last_backward) << "with more buckets than the lag, some step runs in the backward pass";
      ++moved;
    }
    // Each early step's parameter is gathered after its step (the others before the forward
    // pass reads them).
    for (const auto& c : r.comm.collectives) {
      if (c.kind != collective_kind::all_gather || r.t.ops[c.op].phase == op_phase::forward) continue;
      for (tensor_id w : r.t.ops[c.op].writes) {
        const auto step = std::find_if(r.t.ops.begin(), r.t.ops.end(), [&](const op_desc& o) {
          return o.name == "adam." + r.t.tensors[w].name;
        });
        ASSERT_NE(step, r.t.ops.end());
        EXPECT_LT(static_cast<std::size_t>(step - r.t.ops.begin()), c.op) << r.t.tensors[w].name;
      }
    }
  }
  EXPECT_GE(moved, 5);  // the branch above ran
  std::mt19937_64 rng2(spillway::test::test_seed(1));
  const auto t = random_model(rng2, false);
  EXPECT_THROW((void)make_rank_trace(t, {.ranks = 2, .early_step_share = 1.5}), config_error);
  EXPECT_THROW((void)make_rank_trace(t, {.ranks = 2, .early_step_lag = 0}), config_error);
}

TEST(DataParallel, BadInputIsAConfigError) {
  std::mt19937_64 rng(spillway::test::test_seed(5));
  auto t = random_model(rng, false);
  EXPECT_THROW((void)make_rank_trace(t, {.ranks = 0}), config_error);
  EXPECT_THROW((void)make_rank_trace(t, {.ranks = 2, .bucket_bytes = 0}), config_error);
  // A gradient read before the backward pass writes it (accumulated over iterations).
  const auto g = *t.find_tensor("w0.grad");
  t.ops[0].reads.push_back(g);
  try {
    (void)make_rank_trace(t, {.ranks = 2});
    FAIL() << "accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("'w0.grad'"), std::string::npos) << e.what();
  }
}

TEST(DataParallel, EveryZooModelTransforms) {
  for (const auto& name : zoo_model_names()) {
    zoo_options zo;
    const bool cnn = name == "vgg16" || name.rfind("resnet", 0) == 0;
    if (!cnn) zo.layers = 2;
    zo.batch = 2;
    zo.clip_grad_norm = true;
    const auto t = make_model_trace(name, zo);
    const auto r = make_rank_trace(t, {.ranks = 8});
    EXPECT_NO_THROW(r.t.validate()) << name;
    std::uint64_t grad = 0;
    for (const auto& x : t.tensors)
      if (x.kind == tensor_kind::gradient) grad += x.bytes;
    std::uint64_t rs = 0;
    for (const auto& c : r.comm.collectives)
      if (c.kind == collective_kind::reduce_scatter) rs += c.bytes;
    EXPECT_EQ(rs, grad) << name;
  }
}

// --- The network stream, by hand: ops of 1 s, links of 1000 B/s each way (unit_hw).

struct hand_case {
  trace t;
  comm_schedule comm;
  tensor_id g, gs, p;
};

// op0 writes g; op1 reduce-scatters g into gs (2 ranks, 2000 B: 1000 B each way, 1 step);
// op2 is independent compute; op3 reads gs.
hand_case hand() {
  hand_case h;
  h.g = h.t.add_tensor("g", 2000, tensor_kind::activation);
  h.gs = h.t.add_tensor("g.shard", 1000, tensor_kind::gradient);
  h.p = h.t.add_tensor("p", 1000, tensor_kind::parameter);
  auto op = [&](std::string n, std::vector<tensor_id> r, std::vector<tensor_id> w, double s) {
    op_desc o;
    o.name = std::move(n);
    o.reads = std::move(r);
    o.writes = std::move(w);
    o.measured_seconds = s;
    h.t.add_op(std::move(o));
  };
  op("bwd", {}, {h.g}, 1);
  op("rs", {h.g}, {h.gs}, 0);
  op("other", {}, {}, 1);
  op("adam", {h.gs, h.p}, {h.gs}, 1);
  h.comm = {2, {{1, collective_kind::reduce_scatter, 2000}}};
  return h;
}

plan hand_plan(const hand_case& h) {
  auto p = plan::empty_for(h.t, "hand", 1 << 20);
  p.steps[1].evictions.push_back({h.g, evict_action::drop});
  return p;
}

TEST(NetworkStream, ACollectiveRunsBesideComputeAndSharesTheLink) {
  auto h = hand();
  auto hw = testing::unit_hw();
  hw.network_bytes_per_s = 500;  // 2 s for 1000 B, slower than the link
  hw.network_latency_s = 0.1;
  const auto p = hand_plan(h);
  sim_options so;
  so.comm = &h.comm;
  so.record_timeline = true;
  const auto r = simulate(h.t, p, hw, so);
  EXPECT_TRUE(r.feasible()) << (r.violations.empty() ? "" : r.violations[0]);
  // rs: 1 .. 1 + 0.1 + 2 = 3.1; "other" runs 1..2 meanwhile; adam waits for the shard: 3.1..4.1.
  EXPECT_DOUBLE_EQ(r.step_seconds, 4.1);
  EXPECT_EQ(r.collectives, 1u);
  EXPECT_EQ(r.network_bytes, 1000u);
  EXPECT_DOUBLE_EQ(r.network_seconds, 2.1);
  for (const auto& e : r.timeline)
    if (e.track == sim_track::compute && e.id == 2) {
      EXPECT_DOUBLE_EQ(e.start, 1.0);
    }
  // Without the schedule the collective is an op of no time: 3 s of compute.
  EXPECT_DOUBLE_EQ(simulate(h.t, p, hw).step_seconds, 3.0);
  // A fast network: the link is the limit (1000 B at 1000 B/s each way).
  hw.network_bytes_per_s = 1e9;
  hw.network_latency_s = 0;
  EXPECT_NEAR(simulate(h.t, p, hw, so).step_seconds, 3.0, 1e-9);  // rs 1..2, adam 2..3
  // g's memory is freed when the collective that reads it ends (3.1 s), not when it is issued.
  EXPECT_EQ(r.peak_device_bytes, 4000u);  // p + g + the shard
  bool freed_at_end = false;
  for (const auto& m : r.memory) {
    if (m.at_us > 1e6 + 1 && m.at_us < 3.1e6 - 1) {
      EXPECT_EQ(m.bytes, 4000u) << m.at_us;
    }
    if (std::abs(m.at_us - 3.1e6) < 1 && m.bytes == 2000u) freed_at_end = true;
  }
  EXPECT_TRUE(freed_at_end);
}

TEST(NetworkStream, ACopyOutFreesOnlyWhenTheCollectiveReadingItEnds) {
  auto h = hand();
  auto hw = testing::unit_hw();
  hw.network_bytes_per_s = 100;  // rs: 1 .. 1 + 0.1 + 10 = 11.1
  hw.network_latency_s = 0.1;
  auto p = hand_plan(h);
  p.steps[1].evictions = {{h.g, evict_action::evict_to_host}};  // copied out 2..4 (the link is busy 1..2)
  sim_options so;
  so.comm = &h.comm;
  so.record_timeline = true;
  const auto r = simulate(h.t, p, hw, so);
  EXPECT_DOUBLE_EQ(r.step_seconds, 12.1);
  for (const auto& m : r.memory) {
    if (m.at_us > 1e6 + 1 && m.at_us < 11.1e6 - 1) {
      EXPECT_EQ(m.bytes, 4000u) << m.at_us;  // g still held while the collective reads it
    }
  }
}

TEST(NetworkStream, CopiesQueueBehindTheCollectivesLinkShare) {
  auto h = hand();
  auto hw = testing::unit_hw();
  hw.network_bytes_per_s = inf;  // unlimited: no time, no link
  hw.network_latency_s = 0;
  auto p = hand_plan(h);
  p.initial_tier[h.p] = tier::host;
  p.steps[2].prefetches.push_back({h.p, tier::host, 3});  // issued at 1, after the collective
  p.steps[3].evictions.push_back({h.p, evict_action::evict_to_host});
  sim_options so;
  so.comm = &h.comm;
  EXPECT_DOUBLE_EQ(simulate(h.t, p, hw, so).step_seconds, 3.0);  // p lands at 2, adam 2..3 (p unchanged: no copy out)
  hw.network_bytes_per_s = 1e12;  // the collective takes the H2D queue 1..2; p's copy 2..3
  const auto r = simulate(h.t, p, hw, so);
  EXPECT_TRUE(r.feasible()) << (r.violations.empty() ? "" : r.violations[0]);
  EXPECT_NEAR(r.step_seconds, 4.0, 1e-9);
}

TEST(NetworkStream, NoNetworkInTheProfileIsAConfigError) {
  auto h = hand();
  const auto p = hand_plan(h);
  sim_options so;
  so.comm = &h.comm;
  EXPECT_THROW((void)simulate(h.t, p, testing::unit_hw(), so), config_error);
}

// --- Properties over random models, ranks 1..8.

hw_profile prop_hw(double net, double latency) {
  hw_profile hw;
  hw.name = "prop";
  hw.device_bytes = 1ull << 40;
  hw.compute_flops_per_s = 1e12;
  hw.hbm_bytes_per_s = 1e12;
  hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = 1e8;
  hw.copy_engines = 2;
  hw.host_bytes = 1ull << 40;
  hw.nvme_read_bytes_per_s = 5e7;
  hw.nvme_write_bytes_per_s = 3e7;
  hw.nvme_bytes = 1ull << 40;
  hw.network_bytes_per_s = net;
  hw.network_latency_s = latency;
  return hw;  // no host rates: no op goes to the host (whose gap filling is not monotone)
}

void expect_same(const sim_result& a, const sim_result& b) {
  EXPECT_EQ(a.step_seconds, b.step_seconds);
  EXPECT_EQ(a.stall_seconds, b.stall_seconds);
  EXPECT_EQ(a.peak_device_bytes, b.peak_device_bytes);
  EXPECT_EQ(a.h2d_bytes, b.h2d_bytes);
  EXPECT_EQ(a.d2h_bytes, b.d2h_bytes);
  EXPECT_EQ(a.violation_count, b.violation_count);
}

TEST(NetworkStreamProperty, OneRankUnlimitedAndMonotone) {
  std::mt19937_64 rng(spillway::test::test_seed(2026));
  const std::vector<double> bandwidths = {inf, 1e12, 1e10, 1e9, 1e8, 3e7, 1e7, 1e6};
  int checked = 0, mattered = 0;
  for (int iter = 0; iter < 160; ++iter) {
    const auto t = random_model(rng, iter % 3 == 0);
    const auto ranks = static_cast<std::uint32_t>(1 + iter % 8);
    data_parallel_options o{.ranks = ranks};
    o.stage = iter % 2 ? zero_stage::one : zero_stage::two;
    o.gather = iter % 4 < 2 ? gather_placement::before_use : gather_placement::after_step;
    o.bucket_bytes = std::uniform_int_distribution<std::uint64_t>(1, 100'000)(rng);
    o.early_step_share = iter % 5 == 0 ? 0.0 : std::uniform_real_distribution<double>(0, 1)(rng);
    o.early_step_lag = static_cast<std::uint32_t>(1 + iter % 4);
    const auto r = make_rank_trace(t, o);
    expect_shards_written_before_read(r);
    const auto rep = analyze(r.t);
    for (const char* pol : {"none", "lms", "auto"}) {
      const bool roomy = std::string(pol) == "none";
      const double frac = std::uniform_real_distribution<double>(0.3, 1.0)(rng);
      const auto budget = roomy ? rep.peak_live_bytes
                                : std::max(rep.min_budget_bytes, static_cast<std::uint64_t>(frac * rep.peak_live_bytes));
      const auto p = make_planner(pol)->make_plan(r.t, rep, prop_hw(1e9, 1e-5), budget);
      sim_options so;
      so.comm = &r.comm;
      const auto plain = simulate(r.t, p, prop_hw(1e9, 1e-5));
      if (ranks == 1) {  // the same trace, no collectives: the plain simulation exactly
        expect_same(simulate(r.t, p, prop_hw(1e9, 1e-5), so), plain);
        expect_same(simulate(t, p, prop_hw(1e9, 1e-5)), plain);
      }
      // Unlimited bandwidth and no latency: collectives cost nothing.
      const auto free_net = simulate(r.t, p, prop_hw(inf, 0), so);
      if (roomy) {
        EXPECT_EQ(free_net.step_seconds, free_net.compute_seconds) << pol << " ranks " << ranks;
      }
      EXPECT_LE(free_net.step_seconds, plain.step_seconds * (1 + 1e-12)) << pol << " ranks " << ranks;
      EXPECT_EQ(free_net.feasible(), plain.feasible()) << pol;
      // The step never shrinks as the bandwidth drops.
      double last = 0;
      for (double bw : bandwidths) {
        const auto s = simulate(r.t, p, prop_hw(bw, 1e-5), so);
        EXPECT_GE(s.step_seconds, last * (1 - 1e-12)) << pol << " ranks " << ranks << " at " << bw << " B/s";
        if (plain.feasible()) {
          EXPECT_TRUE(s.feasible()) << pol << " at " << bw << ": " << (s.violations.empty() ? "" : s.violations[0]);
        }
        EXPECT_GE(s.step_seconds, s.compute_seconds * (1 - 1e-12));
        last = s.step_seconds;
        ++checked;
      }
      mattered += ranks > 1 && last > free_net.step_seconds;
    }
  }
  EXPECT_GT(checked, 3000);
  EXPECT_GT(mattered, 200);  // the slow networks did slow the step down
}

TEST(NetworkProfile, BuiltinsHaveANetworkAndJsonCarriesIt) {
  const auto h200 = get_profile("h200");
  EXPECT_DOUBLE_EQ(h200.network_bytes_per_s, 50e9);  // 400 Gb/s
  EXPECT_GT(h200.network_latency_s, 0);
  const auto back = profile_from_json(profile_to_json(h200));
  EXPECT_DOUBLE_EQ(back.network_bytes_per_s, h200.network_bytes_per_s);
  EXPECT_DOUBLE_EQ(back.network_latency_s, h200.network_latency_s);
  auto j = profile_to_json(h200);
  j.erase("network_latency_us");
  try {
    (void)profile_from_json(j);
    FAIL() << "a network without its latency was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("network_latency_us"), std::string::npos) << e.what();
  }
  j.erase("network_gbps");
  EXPECT_FALSE(profile_from_json(j).has_network());
  j["network_gbps"] = 50;
  j["network_latency_us"] = -1;
  EXPECT_THROW((void)profile_from_json(j), config_error);
}

TEST(RankPlanning, KeepsTheFastestFeasiblePlanOnTheNetwork) {
  std::mt19937_64 rng(spillway::test::test_seed(11));
  for (int iter = 0; iter < 20; ++iter) {
    const auto t = random_model(rng, false);
    const auto r = make_rank_trace(t, {.ranks = 4, .bucket_bytes = 20'000});
    const auto rep = analyze(r.t);
    const auto hw = prop_hw(3e7, 1e-5);
    const auto budget = std::max(rep.min_budget_bytes, rep.peak_live_bytes / 2);
    rank_plan_options o;
    o.policies = {"lms", "auto"};
    const auto best = plan_rank(r, rep, hw, budget, o);
    EXPECT_EQ(best.tried, 2 * o.policies.size() * o.link_shares.size());  // each plan as made and soonest first
    if (!best.found) continue;
    sim_options so;
    so.comm = &r.comm;
    const auto again = simulate(r.t, rep, best.p, hw, so);
    EXPECT_TRUE(again.feasible());
    EXPECT_EQ(again.step_seconds, best.sim.step_seconds);
    // No policy's plan for the whole link does better.
    for (const auto& pol : o.policies) {
      const auto s = simulate(r.t, rep, make_planner(pol)->make_plan(r.t, rep, hw, budget), hw, so);
      if (s.feasible()) {
        EXPECT_LE(best.sim.step_seconds, s.step_seconds) << pol;
      }
    }
  }
  const auto r = make_rank_trace(random_model(rng, false), {.ranks = 2});
  EXPECT_THROW((void)plan_rank(r, analyze(r.t), prop_hw(1e9, 0), 1ull << 30, {.policies = {}}), config_error);
  // A share out of range is refused, with the value as given, whatever shares come before it.
  for (double bad : {0.0, 1.5, -0.25}) {
    try {
      (void)plan_rank(r, analyze(r.t), prop_hw(1e9, 0), 1ull << 30, {.policies = {"lms"}, .link_shares = {1.0, bad}});
      ADD_FAILURE() << "a link share of " << bad << " was taken";
    } catch (const config_error& e) {
      std::ostringstream given;
      given << "got " << bad;
      EXPECT_NE(std::string(e.what()).find(given.str()), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace spillway::offload
