// auto: the cost-model planner. A sweep in op order keeps the resident set within the budget,
// evicting the tensor whose next use is farthest per second of round-trip copy (Note [auto]);
// prefetches are then moved as early as memory allows, what the host tier cannot hold goes
// to NVMe, and each candidate plan is checked and timed with the simulator.
#include <algorithm>
#include <limits>
#include <queue>

#include <oneapi/tbb/parallel_invoke.h>

#include "offload/plan_builder.hpp"
#include "offload/planner.hpp"
#include "offload/planner_host.hpp"
#include "offload/planner_range_max.hpp"
#include "offload/planner_recompute.hpp"
#include "offload/simulator.hpp"

namespace spillway::offload::detail {

// Note [auto]
// Eviction choice: freeing a tensor for d ops costs its round trip, bytes/h2d (when the value
// is read again) + bytes/d2h (when no tier holds the current value). The sweep evicts the
// resident tensor, not used by the current op, with the largest d * bytes / round-trip time:
// memory-time freed per second of link time (a dead value costs nothing and goes first). It
// is Belady's farthest-next-use rule weighted by what the copy costs. Evictions are placed
// right after the tensor's previous use, so the D2H copy starts as early as possible.
// Late copies: a dirty victim used just before frees its memory only when its D2H ends; if
// the compute since its last use is shorter than that copy, the op that needs the memory
// waits (typically a gradient evicted right after the op that made it). With a late weight
// w > 0 the sweep looks at the four farthest dirty candidates and divides each one's score by
// 1 + w * (uncovered copy seconds / round-trip seconds), so a value whose copy out already
// had time to run is preferred. Model state not yet used in the iteration leaves, when kept
// over the boundary (below), after the first op, its copies out one after another: its
// uncovered time counts the state evicted before it (on h200, gpt2-small at 1/4 of its peak
// had waited 3.6 ms at the loss for the tied embedding's master weights and moments, 3 x 154
// MB, behind each other; now the master weights stay and smaller values leave in their place:
// 24.43 -> 22.74 ms).
// Prefetch placement: intervals are taken in order of use; each prefetch moves back from its
// use while every op in between keeps resident bytes within the budget (earliest issue that
// memory allows). The sweep runs below the budget by a reserve so prefetches have room to
// move.
// Over the boundary: a value written in the iteration and read by the next one (optimizer
// state, weights) that leaves the device starts the iteration in a tier, so its D2H runs after
// its last write, in the optimizer at the very end, where there is little compute left to
// hide it behind. Kept on the device over the boundary instead, it is evicted after the first
// op of the next iteration and its D2H overlaps that iteration's forward pass, which often
// leaves the D2H engine idle (its activations are still being made). It costs memory from its
// last use to the end; keep_over_boundary takes the latest-written values first, up to a
// share of their bytes, where memory allows.
// Search: the simulator is the judge. Stage 1 runs one sweep per sweep reserve and late weight
// (identical sweeps once); stage 2 takes the two fastest and tries each share kept over the
// boundary, later prefetches (Note [Late prefetches]) and the written state homed in the host
// tier (Note [Homed state]). The fastest feasible plan wins. Every candidate is planned and
// simulated in time linear-logarithmic in the trace (range_max for the placement passes).

namespace {

constexpr std::int64_t not_off = -2, off_from_start = -1;

/// at[k]: when op k starts with nothing waiting (the sum of the ops before it); at[n]: the end.
std::vector<double> op_starts(const trace& t, const hw_profile& hw) {
  std::vector<double> at(t.ops.size() + 1, 0);
  for (std::size_t k = 0; k < t.ops.size(); ++k) at[k + 1] = at[k] + hw.op_seconds(t.ops[k]);
  return at;
}

class sweep {
 public:
  sweep(const trace& t, const lifetime_report& r, const hw_profile& hw)
      : t_(t), r_(r), inv_h2d_(1.0 / hw.h2d_bytes_per_s), inv_d2h_(1.0 / hw.d2h_bytes_per_s), at_(op_starts(t, hw)) {}

  std::vector<off_interval> run(std::uint64_t limit, double late_weight, const std::vector<char>* stay) {
    late_weight_ = late_weight;
    stay_ = stay;
    const std::size_t nt = t_.tensors.size();
    const auto n = static_cast<op_index>(t_.ops.size());
    std::vector<off_interval> out;
    in_r_.assign(nt, 0);
    pos_.assign(nt, 0);
    stamp_.assign(nt, -1);
    off_.assign(nt, not_off);
    last_.assign(nt, -1);
    next_.assign(nt, 0);
    has_copy_.assign(nt, 0);
    first_off_.assign(nt, 0);
    resident_.clear();
    boundary_out_ = 0;
    version_.assign(nt, 0);
    for (auto& h : heaps_) h = {};
    std::int64_t cur = 0;
    for (tensor_id x = 0; x < nt; ++x) {
      if (!is_persistent(t_.tensors[x].kind)) continue;
      if (!r_.tensors[x].used()) {
        out.push_back({x, 0, 0, 0, tier::host, true});
        continue;
      }
      insert(x);
      cur += bytes(x);
      push(x);
    }
    for (op_index j = 0; j < n; ++j) {
      const auto& op = t_.ops[j];
      auto touch = [&](tensor_id x) {
        stamp_[x] = j;
        if (in_r_[x]) return;
        if (off_[x] == off_from_start)
          first_off_[x] = 1;
        else if (off_[x] >= 0)
          out.push_back({x, static_cast<op_index>(off_[x]), j, j, tier::host, false});
        off_[x] = not_off;
        insert(x);
        cur += bytes(x);
      };
      for (tensor_id x : op.reads) touch(x);
      for (tensor_id x : op.writes) touch(x);
      while (cur > static_cast<std::int64_t>(limit)) {
        const auto v = pick_victim(j);
        if (v == none_) break;
        evict(v);
        cur -= bytes(v);
      }
      auto after = [&](tensor_id x, bool wrote) {
        if (last_[x] == j) return;
        last_[x] = j;
        const auto& uses = r_.tensors[x].uses;
        while (next_[x] < uses.size() && uses[next_[x]].op <= j) ++next_[x];
        if (wrote) has_copy_[x] = 0;
        if (!is_persistent(t_.tensors[x].kind) && next_[x] == uses.size() && in_r_[x]) {
          erase(x);
          cur -= bytes(x);
        } else if (in_r_[x] && may_leave_device(t_.tensors[x].kind)) {
          push(x);  // a candidate to evict; a metric never is
        }
      };
      for (tensor_id x : op.writes) after(x, true);
      for (tensor_id x : op.reads) after(x, false);
    }
    for (tensor_id x = 0; x < nt; ++x) {
      if (!is_persistent(t_.tensors[x].kind) || !r_.tensors[x].used()) continue;
      const auto& lt = r_.tensors[x];
      if (first_off_[x] || off_[x] != not_off)
        out.push_back({x, lt.last_use(), lt.first_use(), lt.first_use(), tier::host, true});
    }
    return out;
  }

 private:
  static constexpr tensor_id none_ = std::numeric_limits<tensor_id>::max();
  std::int64_t bytes(tensor_id x) const { return static_cast<std::int64_t>(t_.tensors[x].bytes); }

  void insert(tensor_id x) {
    in_r_[x] = 1;
    pos_[x] = resident_.size();
    resident_.push_back(x);
  }
  void erase(tensor_id x) {
    in_r_[x] = 0;
    const auto p = pos_[x];
    resident_[p] = resident_.back();
    pos_[resident_[p]] = p;
    resident_.pop_back();
  }
  void evict(tensor_id x) {
    if (last_[x] < 0 && cost_class(x) == 2) boundary_out_ += bytes(x);  // joins the queue at the start
    erase(x);
    off_[x] = last_[x];  // -1: off since the iteration started
    if (value_needed(x)) has_copy_[x] = 1;
  }
  // After the current op: is the value read again (this iteration, or next for persistents)?
  bool value_needed(tensor_id x) const {
    const auto& lt = r_.tensors[x];
    if (next_[x] < lt.uses.size()) return lt.uses[next_[x]].reads;
    return lt.crosses_boundary;
  }
  // Victim choice with three lazy max-heaps keyed by next use, one per cost class: dead value
  // (free), clean (a tier holds the value: H2D only), dirty (D2H + H2D). Within a class the
  // score dist * bytes / cost orders like the next use, so only the three tops compete.
  struct entry {
    double next_use;
    tensor_id x;
    std::uint32_t version;
    bool operator<(const entry& o) const { return next_use < o.next_use; }
  };
  int cost_class(tensor_id x) const {
    if (!value_needed(x)) return 0;
    return has_copy_[x] ? 1 : 2;
  }
  double next_use_of(tensor_id x) const {
    const auto& lt = r_.tensors[x];
    if (next_[x] < lt.uses.size()) return lt.uses[next_[x]].op;
    return static_cast<double>(t_.ops.size()) + lt.first_use();
  }
  void push(tensor_id x) {
    ++version_[x];
    heaps_[cost_class(x)].push({next_use_of(x), x, version_[x]});
  }
  tensor_id pick_victim(op_index j) {
    const double per_byte[3] = {0.0, inv_h2d_, inv_h2d_ + inv_d2h_};
    double best_score = -1;
    entry best{};
    int best_c = -1;
    for (int c = 0; c < 3; ++c) {
      auto& h = heaps_[c];
      for (int k = 0; k < (late_weight_ > 0 && c == 2 ? 4 : 1); ++k) {
        for (;;) {
          while (!h.empty() && (!in_r_[h.top().x] || version_[h.top().x] != h.top().version || stamp_[h.top().x] == j))
            h.pop();
          if (h.empty() || !stays(h.top().x)) break;
          looked_.push_back({h.top(), c});  // put back below, never chosen
          h.pop();
        }
        if (h.empty()) break;
        const entry e = h.top();
        h.pop();
        looked_.push_back({e, c});
        double score = c == 0 ? std::numeric_limits<double>::infinity() : (e.next_use - j) / per_byte[c];
        if (c == 2 && late_weight_ > 0) {
          // The copy out starts after the last use; what of it the compute since then does not
          // cover delays the op that needs the memory. A value of the last iteration not yet
          // used in this one (model state) is kept over the boundary: its copy starts after the
          // first op, behind those of the values of its kind already evicted (one queue).
          const bool boundary = last_[e.x] < 0;
          const double copy = static_cast<double>((boundary ? boundary_out_ : 0) + bytes(e.x)) * inv_d2h_;
          const double late = std::max(0.0, copy - (at_[j] - at_[boundary ? 1 : last_[e.x] + 1]));
          score /= 1.0 + late_weight_ * late / (static_cast<double>(bytes(e.x)) * per_byte[c]);
        }
        if (score > best_score) {
          best_score = score;
          best = e;
          best_c = c;
        }
      }
    }
    for (const auto& [e, c] : looked_)
      if (best_c < 0 || e.x != best.x) heaps_[c].push(e);
    looked_.clear();
    return best_c < 0 ? none_ : best.x;
  }

  bool stays(tensor_id x) const { return stay_ && x < stay_->size() && (*stay_)[x]; }

  const trace& t_;
  const lifetime_report& r_;
  const std::vector<char>* stay_ = nullptr;  // values never evicted (the search's pins)
  double inv_h2d_, inv_d2h_;
  std::vector<double> at_;  // compute seconds before each op
  std::vector<char> in_r_, has_copy_, first_off_;
  std::vector<std::size_t> pos_, next_;
  std::vector<std::int64_t> stamp_, off_, last_;
  std::vector<tensor_id> resident_;
  std::vector<std::uint32_t> version_;
  std::priority_queue<entry> heaps_[3];
  std::vector<std::pair<entry, int>> looked_;
  double late_weight_ = 0;
  std::int64_t boundary_out_ = 0;  // bytes of dirty victims not yet used in the iteration
};

bool reads_at(const tensor_lifetime& lt, op_index op) {
  for (const auto& u : lt.uses)
    if (u.op == op) return u.reads;
  return false;
}

// Moves each prefetch as early as memory allows (Note [auto]).
void place_prefetches(const trace& t, const lifetime_report& r, std::vector<off_interval>& ivs, std::uint64_t budget) {
  range_max res(resident_bytes(t, r, ivs));
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < ivs.size(); ++i)
    if (r.tensors[ivs[i].x].used() && (ivs[i].wraps ? r.tensors[ivs[i].x].crosses_boundary
                                                    : reads_at(r.tensors[ivs[i].x], ivs[i].use)))
      order.push_back(i);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return ivs[a].use < ivs[b].use; });
  const auto cap = static_cast<std::int64_t>(budget);
  for (auto i : order) {
    auto& iv = ivs[i];
    const auto b = static_cast<std::int64_t>(t.tensors[iv.x].bytes);
    const op_index lo = iv.wraps ? 0 : iv.after + 1;
    if (iv.issue <= lo) continue;
    // The last op before the issue point that has no room for it; the prefetch goes after it.
    const auto full = res.last_above(lo, iv.issue, cap - b);
    const auto k = full < 0 ? lo : static_cast<op_index>(full + 1);
    res.add(k, iv.issue, b);
    iv.issue = k;
  }
}

// Note [Late prefetches]
// As early as memory allows is not always best: a prefetch that lands long before its use holds
// memory all that while, and where the bytes are freed by copies out still running (memory is
// counted free at the eviction, the copy out ends later) the op that needs them waits. With a
// state-heavy model at 1/4 of its footprint (the examples' MLP on an H200-like profile, each
// layer's Adam moments in while the layer before is updated) the moments of layer l came in
// before l's backward op, which then waited for l + 1's moments to leave, while both directions
// of the link idled through that op. A lead of a few copy times puts each prefetch where the
// compute before its use still covers it; the simulator judges it beside the early placement.
void delay_prefetches(const trace& t, const lifetime_report& r, std::vector<off_interval>& ivs, const hw_profile& hw,
                      const std::vector<double>& at, double lead) {
  for (auto& iv : ivs) {
    const auto& lt = r.tensors[iv.x];
    if (!lt.used() || !(iv.wraps ? lt.crosses_boundary : reads_at(lt, iv.use)) || iv.use >= at.size()) continue;
    const double cover = lead * static_cast<double>(t.tensors[iv.x].bytes) / hw.h2d_bytes_per_s;
    // The latest op k <= use whose start leaves `cover` seconds before the use's start.
    const auto end = at.begin() + static_cast<std::ptrdiff_t>(iv.use) + 1;
    const auto k = static_cast<std::int64_t>(std::upper_bound(at.begin(), end, at[iv.use] - cover) - at.begin()) - 1;
    if (k > static_cast<std::int64_t>(iv.issue)) iv.issue = static_cast<op_index>(k);
  }
}

// Keeps across the iteration boundary the values the iteration writes and the next one reads,
// when memory allows from their last use to the end and through the first op: their copy out
// then runs at the start of the next iteration, beside its compute, instead of after the last
// op (Note [auto]). Latest last use first, up to `share` of their bytes: those copies would
// end the step latest.
void keep_over_boundary(const trace& t, const lifetime_report& r, std::vector<off_interval>& ivs,
                        std::uint64_t budget, double share) {
  const op_index n = static_cast<op_index>(t.ops.size());
  if (n < 3) return;
  range_max res(resident_bytes(t, r, ivs));
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < ivs.size(); ++i) {
    const auto& iv = ivs[i];
    const auto& lt = r.tensors[iv.x];
    if (iv.wraps && lt.used() && lt.written && lt.crosses_boundary && iv.issue > 1) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return ivs[a].after > ivs[b].after; });
  double left = 0;
  for (auto i : order) left += static_cast<double>(t.tensors[ivs[i].x].bytes);
  left *= share;
  const auto cap = static_cast<std::int64_t>(budget);
  for (auto i : order) {
    auto& iv = ivs[i];
    const auto b = static_cast<std::int64_t>(t.tensors[iv.x].bytes);
    if (static_cast<double>(b) > left) break;
    if (std::max(res.max(0, 1), res.max(iv.after + 1, n)) + b > cap) continue;
    res.add(iv.after + 1, n, b);
    res.add(0, 1, b);
    left -= static_cast<double>(b);
    iv.after = 0;
    iv.wraps = false;
  }
}

// Note [Homed state]
// A value the iteration writes and the next one reads (weights and optimizer state with the
// update on the device) starts the sweep's plans on the device. Where the sweep sends it off
// mid-iteration, after a use in the forward pass say, its first eviction copies it out, and the
// forward pass is where the copies out of the activations keep that direction of the link busy
// (93-99% on the GPT-2, GPT-3 and ResNet rows of the zoo at 1/4 and 1/8 of their peak on h200
// that `plan --waits` was run on), while copies in idle there. Homed in the host tier instead,
// it is copied out after its last write, in the optimizer steps at the end, where copies out are
// few, comes in before its first use, and every eviction before its update is a drop. The
// candidate adds that wrap-around stretch to each such value of the best two sweeps; the
// simulator judges it beside the others. On the optimal bench's chain of twelve cheap layers at
// 1/4 of its peak on h200, auto went from 26.05 to 23.76 ms against the MILP's 23.49; the zoo's
// rows keep their steps (their best plans place the updates on the host or recompute) for about
// 2% more planning time.
// `ivs` with such a stretch added for each value it sends off the device but not over the boundary.
std::vector<off_interval> home_on_host(const trace& t, const lifetime_report& r, std::vector<off_interval> ivs) {
  std::vector<char> wraps(t.tensors.size(), 0), off(t.tensors.size(), 0);
  for (const auto& iv : ivs) (iv.wraps ? wraps : off)[iv.x] = 1;
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    const auto& lt = r.tensors[x];
    if (off[x] && !wraps[x] && is_persistent(t.tensors[x].kind) && lt.used() && lt.written && lt.crosses_boundary)
      ivs.push_back({x, lt.last_use(), lt.first_use(), lt.first_use(), tier::host, true});
  }
  return ivs;
}

// Sends to NVMe the tensors with the longest stretches off the device until the host tier
// holds the rest (a tensor keeps one tier for the whole iteration).
void assign_tiers(const trace& t, const lifetime_report& r, std::vector<off_interval>& ivs, const hw_profile& hw) {
  const std::size_t n = t.ops.size();
  std::vector<std::uint64_t> span(t.tensors.size(), 0);
  std::vector<char> off(t.tensors.size(), 0);
  std::uint64_t host = 0;
  for (const auto& iv : ivs) {
    if (!off[iv.x]) host += t.tensors[iv.x].bytes;
    off[iv.x] = 1;
    const std::uint64_t len = !r.tensors[iv.x].used() ? n : iv.wraps ? n - iv.after + iv.use : iv.use - iv.after;
    span[iv.x] = std::max(span[iv.x], len);
  }
  if (host <= hw.host_bytes) return;
  std::vector<tensor_id> cand;
  for (tensor_id x = 0; x < t.tensors.size(); ++x)
    if (off[x]) cand.push_back(x);
  std::sort(cand.begin(), cand.end(), [&](auto a, auto b) { return span[a] > span[b]; });
  std::vector<char> to_nvme(t.tensors.size(), 0);
  for (auto x : cand) {
    if (host <= hw.host_bytes) break;
    to_nvme[x] = 1;
    host -= t.tensors[x].bytes;
  }
  for (auto& iv : ivs)
    if (to_nvme[iv.x]) iv.where = tier::nvme;
}

}  // namespace

plan auto_swap_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                    const planner_options& opt, const std::vector<char>* stay) {
  if (r.peak_live_bytes <= budget) return build_plan(t, r, {}, "auto", budget);
  best_plan best;
  const std::vector<double> starts = opt.auto_prefetch_leads.empty() ? std::vector<double>{} : op_starts(t, hw);
  auto attempt = [&](std::vector<off_interval> ivs, double keep, double lead = 0) {
    if (keep > 0) keep_over_boundary(t, r, ivs, budget, keep);
    place_prefetches(t, r, ivs, budget);
    if (lead > 0) delay_prefetches(t, r, ivs, hw, starts, lead);
    assign_tiers(t, r, ivs, hw);
    plan p = build_plan(t, r, std::move(ivs), "auto", budget);
    const auto s = simulate(t, r, p, hw);
    best.offer(std::move(p), s);
    return s;
  };
  // Stage 1: one sweep per sweep reserve and late weight (Note [auto], search).
  struct swept {
    std::vector<off_interval> ivs;
    bool ok;
    double seconds;
  };
  std::vector<swept> tried;
  sweep sw(t, r, hw);
  const double room = static_cast<double>(budget - r.min_budget_bytes);
  for (double reserve : opt.auto_sweep_reserves) {
    const auto limit = r.min_budget_bytes + static_cast<std::uint64_t>(room * (1.0 - std::clamp(reserve, 0.0, 1.0)));
    for (double w : opt.auto_late_weights) {
      auto ivs = sw.run(limit, w, stay);
      if (std::any_of(tried.begin(), tried.end(), [&](const swept& s) { return s.ivs == ivs; })) continue;
      const auto s = attempt(ivs, 0);
      tried.push_back({std::move(ivs), s.feasible(), s.step_seconds});
    }
  }
  // Stage 2: the best two sweeps, keeping part of their values over the boundary.
  std::stable_sort(tried.begin(), tried.end(), [](const swept& a, const swept& b) {
    return a.ok != b.ok ? a.ok : a.seconds < b.seconds;
  });
  for (std::size_t i = 0; i < std::min<std::size_t>(tried.size(), 2); ++i) {
    for (double keep : opt.auto_keep_shares)
      if (keep > 0) (void)attempt(tried[i].ivs, keep);
    for (double lead : opt.auto_prefetch_leads)  // Note [Late prefetches]
      if (lead > 0) (void)attempt(tried[i].ivs, 0, lead);
    if (opt.auto_home_state) {  // Note [Homed state]
      auto homed = home_on_host(t, r, tried[i].ivs);
      if (homed.size() > tried[i].ivs.size()) (void)attempt(std::move(homed), 0);
    }
  }
  return best.take();
}

namespace {

class auto_planner final : public optioned_planner {
 public:
  explicit auto_planner(const planner_options& o) : optioned_planner("auto", o) {}

 private:
  plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) const override {
    if (!hw.runs_host_ops() || std::none_of(t.ops.begin(), t.ops.end(), [](const op_desc& o) { return o.host_capable; }))
      return device_plan(t, r, hw, budget);
    // Host placement (Note [Host placement]): auto's own plans for the device views, and
    // zero-offload's, against the device plan, planned at once; the first of equals wins.
    plan device, z;
    sim_result device_sim, z_sim;
    std::vector<host_candidate> hosted;
    tbb::parallel_invoke(
        [&] {
          device = device_plan(t, r, hw, budget);
          device_sim = simulate(t, r, device, hw);
        },
        [&] {
          // The device part of a host placement with a shorter search (two sweep reserves and
          // late weights, two shares kept over the boundary): the optimizer state is gone from
          // the view, so fewer copies remain to place.
          auto quick = options();
          quick.auto_sweep_reserves = {0.0, 0.15};
          quick.auto_late_weights = {0.0, 4.0};
          quick.auto_keep_shares = {0.5, 1.0};
          hosted = host_candidates(t, r, hw, budget, name(),
                                   [&](const device_view& v, const std::function<sim_result(const plan&)>& judge) {
                                     return auto_planner(quick).device_plan(v.t, v.r, hw, budget, &judge);
                                   });
        },
        [&] {
          z = make_zero_offload_planner(options())->make_plan(t, r, hw, budget);
          z_sim = simulate(t, r, z, hw);
        });
    best_plan best;
    best.offer(std::move(device), device_sim);
    for (auto& c : hosted) {
      c.p.policy = name();
      best.offer(std::move(c.p), c.sim);
    }
    z.policy = name();
    best.offer(std::move(z), z_sim);
    return best.take();
  }
  // `judge`: how the recomputing search judges its candidates (host_candidates' judge for a
  // device view); the swap-only search judges on `t`.
  plan device_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                   const plan_judge* judge = nullptr) const {
    if (options().auto_recompute && std::any_of(t.ops.begin(), t.ops.end(), [](const op_desc& o) { return o.recomputable; }))
      return auto_recompute_plan(t, r, hw, budget, options(), judge);
    return auto_swap_plan(t, r, hw, budget, options());
  }
};

}  // namespace

std::unique_ptr<planner> make_auto_planner(const planner_options& opt) { return std::make_unique<auto_planner>(opt); }

}  // namespace spillway::offload::detail
