// Shared by the recomputation tests (test_planners_recompute.cpp, test_rerun_schedule.cpp), the
// planners' property tests (test_planners.cpp, the replay alone) and the bound tests
// (test_bounds.cpp, the profile and ops alone): a profile and timed ops for hand-made traces,
// random training iterations with recomputable forward ops, and an independent replay of a plan
// that understands reruns.
#pragma once

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "prefetch/plan.hpp"
#include "prefetch/recompute.hpp"
#include "prefetch/trace.hpp"

namespace spillway::offload::recompute_testing {

/// An op for a hand-made trace, with its time.
inline op_desc op_of(std::string name, std::vector<tensor_id> r, std::vector<tensor_id> w, double seconds,
                     bool recomputable = false) {
  op_desc o;
  o.name = std::move(name);
  o.reads = std::move(r);
  o.writes = std::move(w);
  o.measured_seconds = seconds;
  o.recomputable = recomputable;
  return o;
}

inline hw_profile test_hw(double link_bytes_per_s) {
  hw_profile hw;
  hw.name = "test";
  hw.device_bytes = 1ull << 40;
  hw.compute_flops_per_s = 1e12;
  hw.hbm_bytes_per_s = 1e12;
  hw.h2d_bytes_per_s = link_bytes_per_s;
  hw.d2h_bytes_per_s = link_bytes_per_s;
  hw.copy_engines = 2;
  hw.host_bytes = 1ull << 40;
  hw.nvme_read_bytes_per_s = 5e8;
  hw.nvme_write_bytes_per_s = 3e8;
  hw.nvme_bytes = 1ull << 40;
  return hw;
}

// A random training iteration: L layers of 1-3 recomputable forward ops each (reading the
// previous value, sometimes one from further back, and the layer's weight), a loss, a
// backward op per forward op in reverse reading what its forward op read and wrote, and an
// update per weight.
inline trace random_training(std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto size = [&] { return static_cast<std::uint64_t>(pick(1, 40)) * 1000; };
  trace t;
  const auto in = t.add_tensor("input", size(), tensor_kind::activation);
  {
    op_desc load;
    load.name = "load";
    load.writes = {in};
    load.measured_seconds = 1e-5;
    t.add_op(std::move(load));
  }
  struct fwd {
    op_index op;
    tensor_id w, g;
  };
  std::vector<fwd> fwds;
  std::vector<tensor_id> acts{in};
  const int layers = pick(2, 6);
  for (int l = 0; l < layers; ++l) {
    const auto w = t.add_tensor("w" + std::to_string(l), size(), tensor_kind::parameter);
    const auto g = t.add_tensor("g" + std::to_string(l), t.tensors[w].bytes, tensor_kind::gradient);
    for (int k = pick(1, 3); k > 0; --k) {
      op_desc op;
      op.name = "f" + std::to_string(l) + "." + std::to_string(k);
      op.layer = l;
      op.phase = op_phase::forward;
      op.recomputable = true;
      op.measured_seconds = std::uniform_real_distribution<double>(1e-5, 2e-4)(rng);
      std::set<tensor_id> r{acts.back(), w};
      if (acts.size() > 2 && pick(0, 3) == 0) r.insert(acts[static_cast<std::size_t>(pick(0, static_cast<int>(acts.size()) - 2))]);
      op.reads.assign(r.begin(), r.end());
      const auto out = t.add_tensor("a" + std::to_string(t.tensors.size()), size(), tensor_kind::activation);
      op.writes = {out};
      if (pick(0, 4) == 0) op.writes.push_back(t.add_tensor("ws" + std::to_string(t.tensors.size()), size(), tensor_kind::workspace));
      acts.push_back(out);
      fwds.push_back({t.add_op(std::move(op)), w, g});
    }
  }
  const auto loss = t.add_tensor("loss", 4, tensor_kind::metric);
  auto grad = t.add_tensor("d.out", t.tensors[acts.back()].bytes, tensor_kind::activation);
  t.add_op("loss", {acts.back()}, {loss, grad});
  std::set<tensor_id> grads_seen;
  for (auto it = fwds.rbegin(); it != fwds.rend(); ++it) {
    const auto& f = t.ops[it->op];
    op_desc op;
    op.name = "b." + f.name;
    op.phase = op_phase::backward;
    op.layer = f.layer;
    op.measured_seconds = 2 * *f.measured_seconds;
    std::set<tensor_id> r(f.reads.begin(), f.reads.end());
    r.insert(f.writes.front());
    r.insert(grad);
    std::set<tensor_id> w;
    if (grads_seen.count(it->g)) r.insert(it->g);  // accumulates
    grads_seen.insert(it->g);
    w.insert(it->g);
    grad = t.add_tensor("d" + std::to_string(t.tensors.size()), size(), tensor_kind::activation);
    w.insert(grad);
    op.reads.assign(r.begin(), r.end());
    op.writes.assign(w.begin(), w.end());
    t.add_op(std::move(op));
  }
  for (const auto& f : fwds) {
    if (!grads_seen.erase(f.g)) continue;
    op_desc op;
    op.name = "update." + t.tensors[f.w].name;
    op.phase = op_phase::optimizer;
    op.measured_seconds = 1e-5;
    op.reads = {f.w, f.g};
    op.writes = {f.w};
    t.add_op(std::move(op));
  }
  t.validate();
  return t;
}

// Replays a plan ignoring time: resident set, budget (at the start, after each prefetch, each
// rerun and each op), values (a tier copy is valid until the value changes; a rerun makes the
// value it made before, so copies stay valid), reruns' reads; the first fault found, or "" for
// none.
inline std::string logical_check(const trace& t, const plan& p) {
  const auto r = analyze(t);
  std::vector<char> on(t.tensors.size(), 0), valid_off(t.tensors.size(), 0), has_value(t.tensors.size(), 0);
  std::uint64_t cur = 0;
  for (tensor_id x = 0; x < t.tensors.size(); ++x)
    if (is_persistent(t.tensors[x].kind)) {
      has_value[x] = 1;
      if (p.initial_tier[x] == tier::device) {
        on[x] = 1;
        cur += t.tensors[x].bytes;
      } else {
        valid_off[x] = 1;
      }
    }
  if (cur > p.budget_bytes) return "start over budget";
  auto run = [&](op_index o, op_index at) -> std::string {
    for (tensor_id x : t.ops[o].reads)
      if (!on[x] || !has_value[x]) return "op " + std::to_string(o) + " before " + std::to_string(at) + " reads " + t.tensors[x].name;
    for (tensor_id x : t.ops[o].writes) {
      if (!on[x]) cur += t.tensors[x].bytes;
      on[x] = 1;
      has_value[x] = 1;
      if (o == at) valid_off[x] = 0;
    }
    if (cur > p.budget_bytes) return "over budget at " + std::to_string(at);
    return "";
  };
  // Note [Rerun temps before the op]: what reruns made that op k does not touch and nothing
  // reads later goes once the reruns have run.
  const rerun_index reruns(t, p);
  std::vector<char> made_by_rerun(t.tensors.size(), 0);
  std::vector<std::int64_t> freed_at(t.tensors.size(), -1);
  for (op_index k = 0; k < t.ops.size(); ++k) {
    for (const auto& pf : p.steps[k].prefetches) {
      if (on[pf.tensor]) return "prefetch of a resident tensor at " + std::to_string(k);
      if (!valid_off[pf.tensor]) return "prefetch of a lost value at " + std::to_string(k);
      on[pf.tensor] = 1;
      cur += t.tensors[pf.tensor].bytes;
      if (cur > p.budget_bytes) return "prefetch over budget at " + std::to_string(k);
    }
    for (op_index o : p.steps[k].recomputes) {
      if (auto e = run(o, k); !e.empty()) return e;
      for (tensor_id x : t.ops[o].writes) made_by_rerun[x] = 1;
    }
    if (!p.steps[k].recomputes.empty())
      for (tensor_id x = 0; x < t.tensors.size(); ++x)
        if (on[x] && made_by_rerun[x] && reruns.freed_before_op(x, k)) {
          on[x] = 0;
          has_value[x] = 0;
          cur -= t.tensors[x].bytes;
          freed_at[x] = static_cast<std::int64_t>(k);
        }
    if (auto e = run(k, k); !e.empty()) return e;
    for (const auto& e : p.steps[k].evictions) {
      if (!on[e.tensor] && freed_at[e.tensor] == static_cast<std::int64_t>(k)) continue;
      if (!on[e.tensor]) return "evicting non-resident at " + std::to_string(k);
      if (e.action != evict_action::drop) valid_off[e.tensor] = 1;
      if (!valid_off[e.tensor]) has_value[e.tensor] = 0;
      on[e.tensor] = 0;
      cur -= t.tensors[e.tensor].bytes;
    }
  }
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    if (!is_persistent(t.tensors[x].kind)) {
      if (on[x]) return "transient left resident: " + t.tensors[x].name;
    } else if ((p.initial_tier[x] == tier::device) != static_cast<bool>(on[x])) {
      return "persistent ends elsewhere: " + t.tensors[x].name;
    } else if (!on[x] && r.tensors[x].crosses_boundary && !valid_off[x]) {
      return "persistent value lost: " + t.tensors[x].name;
    }
  }
  return "";
}

// A random training trace, a link of one of two speeds, and a budget between the least any
// plan needs and the peak.
struct random_case {
  trace t;
  hw_profile hw;
  lifetime_report rep;
  std::uint64_t budget = 0;
};
inline random_case make_random_case(std::mt19937_64& rng, int iter) {
  random_case c{random_training(rng), test_hw(iter % 2 ? 1e8 : 1e9), {}, 0};
  c.rep = analyze(c.t);
  const std::uint64_t lo = c.rep.min_budget_bytes, hi = std::max(c.rep.peak_live_bytes, lo);
  c.budget = std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  return c;
}

}  // namespace spillway::offload::recompute_testing
