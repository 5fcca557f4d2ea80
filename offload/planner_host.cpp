// Host placement (Note [Host placement]): the device view of a trace, the plan for the real
// trace made from a plan for the view, auto's host candidates and the zero-offload baseline.
#include "offload/planner_host.hpp"

#include <algorithm>

#include "offload/planner_recompute.hpp"
#include "offload/simulator.hpp"

namespace spillway::offload::detail {

// Note [Host placement]
// A plan that runs some host_capable ops on the host (Note [Host ops] in prefetch/plan.hpp) is
// made in two parts. The device part is any device planner's plan for the device view: the
// trace with the host ops kept in place as ops that touch nothing and take no time, so the
// tensors only they touch (fp32 master weights, Adam moments) are unused there. The host part
// is added on top:
//  - the host ops are marked on_host; the tensors only they touch start and end in the host
//    tier (no copy at all);
//  - a tensor they share with device ops must be used on the device only before every host
//    use (gradients: written by the backward pass, read by the step; 16-bit weights: read by
//    the forward and backward passes, written by the step). It is homed in the host tier: the
//    device reads it by a prefetch before its first device use (at op 0 where the view's plan
//    had it resident from the start), and after its last device use (a rerun the view's plan
//    makes counts as a use of its op's reads) it is copied to the host when a host op reads
//    that value (the 16-bit gradient), else dropped (the weights: the host copy is the one the
//    step rewrites). Copies to NVMe in the view's plan become copies to the host tier, which
//    the host op reads.
// auto weighs every placeable step on the host, the steps that would outlast the device's work
// moved back to it (tail_on_device: the last gradients'), and the steps cheaper on the host than
// their state's round trip. Where the fastest of these still stalls, it is mostly the forward
// pass waiting for the 16-bit weights the steps rewrote: they are all copied up again during
// the forward pass, and the link moves them more slowly than the compute uses them (GPT-3 6.7B
// at 1/4 of its peak on h200: 255 ms of copies up beside 216 ms of forward compute). A step run
// on the device leaves its weight there across the iteration, so up to three more candidates
// run the last steps in program order on the device (the first layers', whose weights the
// forward pass reads first; last_steps_on_device), as many weight bytes as the link moves in
// the time the best candidate stalls, adding the new stall each round while the step shortens
// (on h200 at 1/4 of the peak: GPT-3 6.7B 700.0 -> 668.6 ms, 13B 1335.4 -> 1263.5; at 1/8 the
// device has no room for their state and the first round is slower, so none is kept).
// Ops whose shared tensors break that order stay on the device (placeable_on_host). The result
// is judged by the simulator on the real trace like every other candidate, and so is each plan
// auto's recomputing search weighs for the view (host_candidates' judge): a view's plan that
// fills the link with swaps is judged with the weights and gradients it must also carry.
// Tried and not kept: weights homed on the device with a copy in the host tier as well, the
// step rewriting the host copy and a prefetch issued after it bringing the new value up before
// the iteration ends, so the next forward pass finds it there (a plan state of its own, checked
// by the simulator at both ends of the iteration). At 1/8 of the peak on h200 the forward pass
// is bound by the link both ways (GPT-3 6.7B: 266 ms of weights up and 260 ms of activations
// down beside 216 ms of compute). Mirroring the first layers' weights shortens it (6.7B: 274.4
// -> 262.7 ms, then waiting on the copies out; 13B, eight layers: 509.5 -> 416.5 ms), but their
// copies up move behind the backward pass, whose memory holds them back until it ends (13B: 3.8
// -> 93.0 ms after it): 737.38 -> 733.41 ms and 1379.30 -> 1375.55. Deeper layers, held longer,
// are slower (13B, layers 12-19 mirrored: 1401.9 ms); at 1/4 nothing changes (the first layers'
// steps already run on the device); ZeRO-Offload's 10B GPT on v100: 10939.8 -> 10931.8 ms.

namespace {

struct use_span {
  std::int64_t first_dev = -1, last_dev = -1, first_host = -1;
  bool host_reads_first = false;  // the first host use reads the value
  bool dev_reads_first = false;   // the first device use reads the value
};

std::vector<use_span> spans(const trace& t, const lifetime_report& r, const std::vector<char>& on_host) {
  std::vector<use_span> out(t.tensors.size());
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    auto& s = out[x];
    for (const auto& u : r.tensors[x].uses) {
      if (on_host[u.op]) {
        if (s.first_host < 0) {
          s.first_host = u.op;
          s.host_reads_first = u.reads;
        }
      } else {
        if (s.first_dev < 0) {
          s.first_dev = u.op;
          s.dev_reads_first = u.reads;
        }
        s.last_dev = u.op;
      }
    }
  }
  return out;
}

bool any_set(const std::vector<char>& v) { return std::any_of(v.begin(), v.end(), [](char c) { return c != 0; }); }

}  // namespace

std::vector<char> placeable_on_host(const trace& t, const lifetime_report& r, std::vector<char> wanted) {
  wanted.resize(t.ops.size(), 0);
  for (op_index k = 0; k < t.ops.size(); ++k)
    if (!t.ops[k].host_capable) wanted[k] = 0;
  for (bool changed = true; changed;) {
    changed = false;
    const auto sp = spans(t, r, wanted);
    for (tensor_id x = 0; x < t.tensors.size(); ++x) {
      const auto& s = sp[x];
      if (s.first_host < 0 || s.last_dev < s.first_host) continue;
      // A device use after a host use: the host ops before it stay on the device.
      for (const auto& u : r.tensors[x].uses)
        if (wanted[u.op] && static_cast<std::int64_t>(u.op) < s.last_dev) {
          wanted[u.op] = 0;
          changed = true;
        }
    }
  }
  return wanted;
}

std::vector<char> all_host_ops(const trace& t, const lifetime_report& r, const hw_profile& hw) {
  std::vector<char> want(t.ops.size(), 0);
  if (!hw.runs_host_ops()) return want;
  for (op_index k = 0; k < t.ops.size(); ++k) want[k] = t.ops[k].host_capable ? 1 : 0;
  return placeable_on_host(t, r, std::move(want));
}

std::vector<char> cheaper_host_ops(const trace& t, const lifetime_report& r, const hw_profile& hw) {
  std::vector<char> want(t.ops.size(), 0);
  if (!hw.runs_host_ops()) return want;
  for (op_index k = 0; k < t.ops.size(); ++k) {
    const auto& op = t.ops[k];
    if (!op.host_capable) continue;
    // The state only host_capable ops touch would cross the link both ways on the device.
    double state = 0;
    auto add = [&](tensor_id x) {
      for (const auto& u : r.tensors[x].uses)
        if (!t.ops[u.op].host_capable) return;
      state += static_cast<double>(t.tensors[x].bytes);
    };
    for (tensor_id x : op.reads) add(x);
    for (tensor_id x : op.writes)
      if (std::find(op.reads.begin(), op.reads.end(), x) == op.reads.end()) add(x);
    const double round_trip = state / hw.h2d_bytes_per_s + state / hw.d2h_bytes_per_s;
    want[k] = hw.host_op_seconds(op) < round_trip ? 1 : 0;
  }
  return placeable_on_host(t, r, std::move(want));
}

device_view make_device_view(const trace& t, const std::vector<char>& on_host) {
  device_view v;
  v.t = t;
  v.on_host = on_host;
  v.on_host.resize(t.ops.size(), 0);
  for (op_index k = 0; k < t.ops.size(); ++k) {
    if (!v.on_host[k]) continue;
    auto& op = v.t.ops[k];
    op.reads.clear();
    op.writes.clear();
    op.flops = 0;
    op.bytes = 0;
    op.measured_seconds = 0.0;
    op.host_capable = false;
  }
  v.r = analyze(v.t);
  return v;
}

plan plan_from_view(const trace& t, const lifetime_report& r, const device_view& v, const plan& pv, std::string policy,
                    bool params_up_front) {
  plan p = pv;
  p.policy = std::move(policy);
  for (op_index k = 0; k < t.ops.size(); ++k) p.steps[k].on_host = v.on_host[k] != 0;
  auto sp = spans(t, r, v.on_host);
  std::vector<char> host_side(t.tensors.size(), 0);
  for (tensor_id x = 0; x < t.tensors.size(); ++x) host_side[x] = sp[x].first_host >= 0;
  // A rerun the view's plan makes before op k reads its op's inputs there: a device use of
  // them at k (a weight a rerun reads after the last pass that read it stays until that rerun
  // is done). Not past the first host use: a rerun reads values the host has not rewritten.
  for (op_index k = 0; k < t.ops.size(); ++k)
    for (op_index o : pv.steps[k].recomputes)
      for (tensor_id x : t.ops[o].reads) {
        auto& s = sp[x];
        if (host_side[x] && s.first_dev >= 0 && static_cast<std::int64_t>(k) > s.last_dev &&
            static_cast<std::int64_t>(k) < s.first_host)
          s.last_dev = static_cast<std::int64_t>(k);
      }
  // The view's copies of host-side tensors: none for those only host ops touch, host instead of
  // NVMe for shared ones, and the shared ones' evictions after their last device use replaced.
  for (op_index k = 0; k < t.ops.size(); ++k) {
    auto& st = p.steps[k];
    std::erase_if(st.evictions, [&](const eviction& e) {
      const auto& s = sp[e.tensor];
      return host_side[e.tensor] && (s.first_dev < 0 || static_cast<std::int64_t>(k) == s.last_dev ||
                                     (pv.initial_tier[e.tensor] == tier::device && static_cast<std::int64_t>(k) < s.first_dev));
    });
    for (auto& e : st.evictions)
      if (host_side[e.tensor] && e.action == evict_action::evict_to_nvme) e.action = evict_action::evict_to_host;
    std::erase_if(st.prefetches, [&](const prefetch& f) { return host_side[f.tensor] && sp[f.tensor].first_dev < 0; });
    for (auto& f : st.prefetches)
      if (host_side[f.tensor]) f.from = tier::host;
  }
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    if (!host_side[x]) continue;
    const auto& s = sp[x];
    const bool persistent = is_persistent(t.tensors[x].kind);
    if (persistent) p.initial_tier[x] = tier::host;
    if (s.first_dev < 0) continue;
    const auto first = static_cast<op_index>(s.first_dev), last = static_cast<op_index>(s.last_dev);
    p.steps[last].evictions.push_back({x, s.host_reads_first ? evict_action::evict_to_host : evict_action::drop});
    if (!persistent || !s.dev_reads_first || !r.tensors[x].crosses_boundary) continue;
    // Resident from the start in the view: brought up at op 0 now. Else the view's prefetch
    // for the first use, moved to op 0 when asked (resident for the whole step).
    bool had_prefetch = false;
    for (op_index k = 0; k <= first && !had_prefetch; ++k) {
      auto& pfs = p.steps[k].prefetches;
      for (auto it = pfs.begin(); it != pfs.end(); ++it)
        if (it->tensor == x && it->use == first) {
          had_prefetch = true;
          if (params_up_front && k > 0) {
            const prefetch moved = *it;
            pfs.erase(it);
            p.steps[0].prefetches.push_back(moved);
          }
          break;
        }
    }
    if (!had_prefetch) p.steps[0].prefetches.push_back({x, tier::host, first});
  }
  // The copies up at the first op in the order of their use: the link serves them first in,
  // first out, and the first ops' weights should not wait behind the last layer's.
  std::stable_sort(p.steps[0].prefetches.begin(), p.steps[0].prefetches.end(),
                   [](const prefetch& a, const prefetch& b) { return a.use < b.use; });
  return p;
}

std::vector<char> tail_on_device(const trace& t, const std::vector<char>& on_host, const sim_result& sim,
                                 double least_tail_seconds) {
  double device_end = 0;
  for (const auto& e : sim.timeline)
    if (e.track == sim_track::compute || e.track == sim_track::recompute) device_end = std::max(device_end, e.end);
  auto out = on_host;
  out.resize(t.ops.size(), 0);
  if (sim.step_seconds - device_end <= least_tail_seconds) return out;
  for (const auto& e : sim.timeline)
    if (e.track == sim_track::host && e.end > device_end && e.id < out.size()) out[e.id] = 0;
  return out;
}

std::vector<char> last_steps_on_device(const trace& t, const lifetime_report& r, const std::vector<char>& on_host,
                                       double weight_bytes) {
  auto out = on_host;
  out.resize(t.ops.size(), 0);
  double moved = 0;
  for (op_index k = t.ops.size(); k-- > 0 && moved < weight_bytes;) {
    if (!out[k]) continue;
    out[k] = 0;
    for (tensor_id x : t.ops[k].writes) {
      const auto& uses = r.tensors[x].uses;
      if (std::any_of(uses.begin(), uses.end(), [&](const tensor_use& u) { return u.reads && !t.ops[u.op].host_capable; }))
        moved += static_cast<double>(t.tensors[x].bytes);
    }
  }
  return placeable_on_host(t, r, std::move(out));
}

std::vector<host_candidate> host_candidates(const trace& t, const lifetime_report& r, const hw_profile& hw,
                                            std::uint64_t budget, const std::string& name, const view_planner& plan_view) {
  std::vector<host_candidate> out;
  std::vector<std::vector<char>> sets;
  auto plan_set = [&](const std::vector<char>& set, bool timeline) -> bool {
    if (!any_set(set) || std::find(sets.begin(), sets.end(), set) != sets.end()) return false;
    sets.push_back(set);
    const auto v = make_device_view(t, set);
    if (v.r.min_budget_bytes > budget) return false;
    const std::function<sim_result(const plan&)> judge = [&](const plan& candidate) {
      return simulate(t, r, plan_from_view(t, r, v, candidate, name), hw);
    };
    const plan pv = plan_view(v, judge);
    plan p = plan_from_view(t, r, v, pv, name);
    sim_options o;
    o.record_timeline = timeline;
    auto sim = simulate(t, r, p, hw, o);
    out.push_back({std::move(p), std::move(sim)});
    return true;
  };
  const auto all = all_host_ops(t, r, hw);
  if (plan_set(all, true)) {
    // The steps still running on the host when the device has finished hold the step up (the
    // embedding's, whose gradient is done last): where that tail is over 1% of the step, a
    // candidate runs them on the device, their state kept there or swapped by the plan.
    auto& sim = out.back().sim;
    auto fewer = tail_on_device(t, all, sim, 0.01 * sim.step_seconds);
    sim.timeline.clear();
    if (fewer != all) (void)plan_set(placeable_on_host(t, r, fewer), false);
  }
  (void)plan_set(cheaper_host_ops(t, r, hw), false);
  // A forward pass waiting for the weights the host sends back up (Note [Host placement]): the
  // first layers' steps run on the device, their weights kept there across the iteration.
  if (out.empty()) return out;
  const auto by_step = [](const host_candidate& a, const host_candidate& b) {
    return a.sim.step_seconds < b.sim.step_seconds;
  };
  std::vector<char> base_set(t.ops.size(), 0);
  double stall = 0, step = 0, keep = 0;
  {  // the fastest so far, read before `out` grows
    const auto& base = *std::min_element(out.begin(), out.end(), by_step);
    for (op_index k = 0; k < t.ops.size(); ++k) base_set[k] = base.p.steps[k].on_host ? 1 : 0;
    stall = base.sim.stall_seconds;
    step = base.sim.step_seconds;
  }
  for (int round = 0; round < 3 && stall > 0.01 * step; ++round) {
    keep += stall * hw.h2d_bytes_per_s;
    if (!plan_set(last_steps_on_device(t, r, base_set, keep), false) || !(out.back().sim.step_seconds < step)) break;
    stall = out.back().sim.stall_seconds;
    step = out.back().sim.step_seconds;
  }
  return out;
}

namespace {

class zero_offload_planner final : public optioned_planner {
 public:
  explicit zero_offload_planner(const planner_options& o) : optioned_planner("zero-offload", o) {}

 private:
  plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) const override {
    const auto checkpoint = make_checkpoint_planner(options());
    const auto set = all_host_ops(t, r, hw);
    if (!any_set(set)) {
      plan p = checkpoint->make_plan(t, r, hw, budget);
      p.policy = name();
      return p;
    }
    const auto v = make_device_view(t, set);
    const plan pv = checkpoint->make_plan(v.t, v.r, hw, budget);
    plan p = plan_from_view(t, r, v, pv, name(), true);
    // DeepSpeed's step: Adam on the CPU once the backward pass is done, one tensor after another,
    // and the next forward pass once every 16-bit weight is back on the device.
    for (op_index k = 0; k < t.ops.size(); ++k) p.steps[k].synchronous = p.steps[k].on_host;
    p.steps[0].synchronous = true;
    return p;
  }
};

class all_on_host_planner final : public planner {
 public:
  explicit all_on_host_planner(std::unique_ptr<planner> device) : device_(std::move(device)) {}
  [[nodiscard]] std::string name() const override { return device_->name(); }

 private:
  plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) const override {
    const auto set = all_host_ops(t, r, hw);
    if (!any_set(set)) return device_->make_plan(t, r, hw, budget);
    const auto v = make_device_view(t, set);
    const plan pv = device_->make_plan(v.t, v.r, hw, budget);
    return plan_from_view(t, r, v, pv, device_->name());
  }
  std::unique_ptr<planner> device_;
};

}  // namespace

std::unique_ptr<planner> make_all_on_host_planner(std::unique_ptr<planner> device_planner) {
  return std::make_unique<all_on_host_planner>(std::move(device_planner));
}

std::unique_ptr<planner> make_zero_offload_planner(const planner_options& opt) {
  return std::make_unique<zero_offload_planner>(opt);
}

}  // namespace spillway::offload::detail
