// The reference times every simulation result carries: compute alone and the lower bound that
// no plan beats, recomputing or not (Note [Lower bound]).
#include "offload/simulator.hpp"

#include <algorithm>
#include <limits>
#include <queue>
#include <tuple>
#include <vector>

#include "offload/bound_transfer.hpp"
#include "offload/bound_window.hpp"
#include "offload/planner_host.hpp"

namespace spillway::offload {

// Note [Lower bound]
// Let B be the budget and, for op j, N_j the needed bytes (Note [Live and needed bytes]).
// lower_bound is the largest of compute time and three families of bounds; each holds for every
// plan that keeps the budget, whether or not it reruns ops (Note [Recomputation]). Reruns only
// add compute, so every "compute still to run" below stays a lower bound with them; what they
// change is which values owe a copy. A value last written by a recomputable op w is
// regenerable at op j when j < u_w, the first op after w that writes one of w's reads: it may
// be off while op j runs and come back by a rerun, with no copy either way. From op u_w on it
// cannot be made again, so it is an ordinary value.
// (1) Volume, per use: Note [Per-use transfer bound] (bound_transfer.cpp) gives the least H2D
//     and D2H bytes (and NVMe reads and writes past the host tier) any plan moves in one
//     iteration, counting a tensor once for every use it cannot stay on the device for.
//     Time >= max(H2D/h2d_bw, D2H/d2h_bw, NVMe_r/nvme_r_bw, NVMe_w/nvme_w_bw), with the H2D
//     and D2H terms added when the profile has one copy engine.
//     state_bound is the same with every transient value free to drop and make again (only
//     the model state's bytes count), maxed with compute: a relaxation of (1), so never above it.
// (2) Order around one op. Fix op j, running over [s_j, e_j], and an instant tau in it. The
//     device holds the working set S_j of op j all that time, and at most B bytes in all, so
//     at tau at least K_j = N_j - B bytes of needed tensors that op j does not touch are not
//     allocated ("off"). Take such a tensor x. If its value is regenerable at j, it owes no
//     copy in (a) or (b) below (it counts as free on both sides). Otherwise its memory was
//     freed before tau; it is taken again only after tau (a prefetch or an allocation takes
//     memory at one instant, program order), and its copy in starts after that. So:
//     (a) if its next use is in this iteration (at op r; it reads x, x being needed), an H2D
//         of x runs after tau and ends before s_r, after which ops r.. still run: T >= tau +
//         (bytes of such x with r <= k)/h2d_bw + F_k for every k, with F_k the compute of
//         ops k..n-1. If its next read is in the next iteration, nothing is owed here (0).
//     (b) if this iteration wrote x before j (last at op w), that value exists only on the
//         device until copied out, and it is needed later, so a D2H of it ran after e_w (the
//         eviction is issued at an op boundary >= e_w; a copy of a rerun's value is later
//         still) and ended before tau: the D2H queue starts at 0 and serves one copy at a
//         time, so tau >= E_w' + (bytes of such x with w >= w')/d2h_bw for every w', with E_w'
//         the compute of ops 0..w'. Otherwise nothing is owed here (0).
//     Which tensors are off is the plan's choice; the bound takes for each side separately the
//     choice of K_j bytes that costs least there (a sum of two minima is at most the minimum
//     of the sum): for (b), first the ones that owe nothing, then the earliest written; for
//     (a), first the ones that owe nothing, then the latest read (for a fixed amount these
//     sets make every term of the max smallest at once; the last one counts in part, which
//     only lowers the bound). With D_j and H_j those two least values:
//       tau = s_j:  T >= max(C_<j, D_j) + max(dur(j) + C_>j, H_j)
//       tau -> e_j: T >= max(C_<=j, D_j) + max(C_>j, H_j)
//     (C_<j, C_<=j, C_>j: compute before, through and after op j; s_j >= C_<j, e_j >= C_<=j.)
//     The H2D of (a) may start during op j (an allocation made when op j has already
//     started), which is why dur(j) is not added to both sides.
//     (c) Late copies out. Among the tensors (b) lets off for free, take those the iteration
//         writes again after op j (last at op w_x) and the next iteration reads (persistent,
//         so never regenerable). If such an x
//         is off at tau and no D2H of it ran before tau in this iteration, it did not start
//         the iteration on the device (freeing it there needs a copy out: no tier holds its
//         value), so it started in a tier and must end there with its final value: a D2H
//         after e_{w_x}. So each is either "pre" (a D2H before tau, which starts after op 0
//         ends, as every eviction follows an op) or "late". With L the late bytes, for every
//         op k after j: T >= tau + (bytes off at tau read at ops <= k)/h2d_bw +
//         max(F_k, dur(k) + (late bytes with w_x >= k)/d2h_bw), their copies out starting
//         after e_{w_x} >= e_k = s_k + dur(k). For a given amount L the least pre side
//         D(L) (the untouched tensors that owe nothing first, then pre bytes, then the
//         earliest written of (b)) falls as L grows and the least late side H'(L) (latest
//         read first for the copies in, earliest last write first for the late ones) grows;
//         on a grid L_0 = 0 < ... < L_G = all such bytes, every L in [L_i, L_i+1] gives at
//         least max(C_<j, D(L_i+1)) + max(dur(j) + C_>j, H'(L_i)) (and the form at e_j), so
//         the least of these over i is a bound.
//     (d) Reruns are compute. A regenerable x that is off at tau and read again in this
//         iteration comes back after tau (its memory is taken after tau) by a copy in or by a
//         rerun of its writer w, which runs on the compute stream after tau, beside the
//         compute still to run. One rerun of w remakes all it writes, so x's share of it is
//         dur(w) bytes(x) / (bytes w writes), and the shares of the values a set of reruns
//         remakes add up to at most their time. Taking the K_j bytes off as in (a) but with
//         the regenerable ones owing a copy in or their share of a rerun (the cheapest share
//         per byte first), the time after tau is at least max(compute after tau + R,
//         copies in as in (a)) for the split the plan makes, and the least over splits is a
//         bound (remake_or_copy). Without it a regenerable value is free, and a trace whose
//         activations are all regenerable gets no more than compute time.
//     (e) Copies of regenerable values. (d) lets a regenerable x come back by a copy in with
//         no copy out, but the value it brings was written at op w < j in this iteration, so
//         a D2H of it ran after e_w (or after a rerun of w, later still) and ended before
//         tau, as for the values of (b). So of the regenerable values off at tau and read
//         again, those not remade owe a copy out as well: with q the bytes remade, the copy
//         out side owes K_j less the free bytes less q (the values of (b) and the regenerable
//         ones, earliest written first), and the bound at tau is the least over q of
//         max(C_<j, D(q)) + max(dur(j) + C_>j + R(q), H(q)) (and the form at e_j), D and H
//         falling and R rising with q (out_remake_or_copy). It is taken beside (d), not in
//         place of it.
//     (f) Reruns need their inputs. A rerun of w after tau needs w's reads on the device. Take
//         a read y of w that no op reads after op j (dead there: not counted in N_j), that no
//         op but w reads, whose writer writes nothing else, and of at least the bytes w
//         writes. If y is on the device at tau, it takes budget that w's values off at tau
//         free, no more (with those conditions at every step of the chain, no other value
//         needs y for its rerun): those values might as well have stayed (no cheaper plan), so
//         leave that case out. If y is copied in after tau, that copy is at least as large as
//         a copy of w's values, its copy out able to start when y's writer w_y ends: the
//         bound counts it as a copy of w's values written at w_y (earlier, so never above
//         it). Otherwise y is remade by a rerun of w_y after tau, and so on up the chain (8
//         steps at most; beyond, free). So w's values are charged, as their share of one
//         rerun, w's time plus w_y's time and that of w_y's own chain, and their copies out
//         may start after the earliest writer in it; where some such writer cannot run again
//         (an input changed), w's values count as values of (b) written by that earliest
//         writer, owing a copy out and a copy in.
//     Each op's bound scans every tensor, so on a large trace (ops with N_j > B times tensors
//     above order_work_limit) it is taken only at some ops: half of them those with the most
//     needed bytes, half spread evenly among the ops with N_j > B. The largest over any set of
//     ops is still a bound; what is given up is the ops left out (so the figure can fall short
//     of the all-ops one on a large trace, never pass a plan).
// (3) Memory windows: Note [Memory windows] (bound_window.cpp). (1) and (2) take a value that
//     may be made again as free of copies wherever its writer can still run; (3) looks at the
//     memory the rerun itself needs beside the values that must stay, and charges the copies
//     in or out a stretch of ops then owes beside its compute.
// All three ignore latency and every other dependency, so no plan beats them. ideal is compute
// alone (unlimited memory).

namespace {

// Ops x tensors the order bound scans at most (Note [Lower bound], end of (2)).
constexpr double order_work_limit = 5e6;

// Family (2) of Note [Lower bound]: the order bound around op j, for every j in one sweep.
class order_bound {
 public:
  order_bound(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget)
      : t_(t), r_(r), hw_(hw), budget_(budget), n_(t.ops.size()), until_(detail::remake_until(t, r)) {
    dur_.resize(n_);
    rate_.assign(n_, 0.0);
    before_.assign(n_ + 1, 0);  // before_[k]: compute of ops < k
    out_.assign(n_, 0);
    for (std::size_t k = 0; k < n_; ++k) {
      dur_[k] = hw.op_seconds(t.ops[k]);
      before_[k + 1] = before_[k] + dur_[k];
      std::uint64_t out = 0;
      for (tensor_id x : t.ops[k].writes) out += t.tensors[x].bytes;
      out_[k] = out;
      if (out > 0) rate_[k] = dur_[k] / static_cast<double>(out);
    }
    readers_.assign(t.tensors.size(), 0);
    for (tensor_id x = 0; x < t.tensors.size(); ++x)
      for (const auto& u : r.tensors[x].uses) readers_[x] += u.reads ? 1 : 0;
  }

  // Returns {seconds, op}.
  std::pair<double, op_index> run() {
    const std::size_t nt = t_.tensors.size();
    const auto chosen = chosen_ops();
    std::vector<std::size_t> next(nt, 0);  // index of the first use at an op > j (after advancing)
    std::vector<std::int64_t> last_write(nt, -1), final_write(nt, -1);
    for (tensor_id x = 0; x < nt; ++x)
      for (const auto& u : r_.tensors[x].uses)
        if (u.writes) final_write[x] = u.op;
    std::vector<char> touched(nt, 0);
    double best = 0;
    op_index best_op = 0;
    for (op_index j = 0; j < n_; ++j) {
      const auto& op = t_.ops[j];
      for (tensor_id x : op.reads) touched[x] = 1;
      for (tensor_id x : op.writes) touched[x] = 1;
      const std::size_t scan = chosen[j] ? nt : 0;  // ops left out only advance the uses
      std::uint64_t needed = r_.working_set_bytes[j], free_d = 0, free_h = 0;
      d_.clear();
      h_.clear();
      l_.clear();
      g_.clear();
      gd_.clear();
      std::uint64_t regen_h = 0;  // bytes of g_: regenerable, read again in this iteration
      std::uint64_t late_total = 0;
      for (tensor_id x = 0; x < scan; ++x) {
        const auto& lt = r_.tensors[x];
        if (touched[x] || !lt.used()) continue;
        const std::uint64_t b = t_.tensors[x].bytes;
        const bool has_next = next[x] < lt.uses.size();
        const bool is_needed = has_next ? lt.uses[next[x]].reads : lt.crosses_boundary;
        if (!is_needed) continue;
        needed += b;
        if (last_write[x] >= 0 && j < until_[static_cast<std::size_t>(last_write[x])]) {
          const auto w = static_cast<std::size_t>(last_write[x]);
          const auto c = has_next ? chain(j, w, out_[w], 0, touched, next, last_write) : chain_cost{};
          if (!c.blocked) {
            free_d += b;  // regenerable: a rerun brings it back, no copy either way
            free_h += b;  // (the rerun's compute: (d) of Note [Lower bound], from g_)
            if (has_next) {
              g_.push_back({lt.uses[next[x]].op, b, (dur_[w] + c.seconds) / static_cast<double>(out_[w])});
              gd_.push_back({std::min(w, c.earliest), b});
              regen_h += b;
            }
            continue;
          }
          d_.push_back({c.earliest, b});  // (f): a copy of it, or of a value of its chain
          h_.push_back({lt.uses[next[x]].op, b});
          continue;
        }
        if (last_write[x] >= 0) {
          d_.push_back({static_cast<std::size_t>(last_write[x]), b});
        } else {
          free_d += b;
          if (lt.crosses_boundary && final_write[x] > static_cast<std::int64_t>(j)) {
            l_.push_back({static_cast<std::size_t>(final_write[x]), b});
            late_total += b;
          }
        }
        if (has_next)
          h_.push_back({lt.uses[next[x]].op, b});
        else
          free_h += b;
      }
      if (chosen[j] && needed > budget_) {
        const std::uint64_t off = needed - budget_;
        const double dmin = d2h_before(off > free_d ? off - free_d : 0);
        const double hmin = h2d_after(off > free_h ? off - free_h : 0);
        const double after = before_[n_] - before_[j + 1];
        double h_start = hmin, h_end = hmin;
        if (regen_h > 0) {
          const std::uint64_t free_copy = free_h - regen_h;  // owe no copy in and no rerun
          const std::uint64_t need = off > free_copy ? off - free_copy : 0;
          prepare_split(need);
          h_start = std::max(h_start, remake_or_copy(dur_[j] + after));
          h_end = std::max(h_end, remake_or_copy(after));
        }
        double at_start = std::max(before_[j], dmin) + std::max(dur_[j] + after, h_start);
        double at_end = std::max(before_[j + 1], dmin) + std::max(after, h_end);
        if (regen_h > 0) {
          prepare_copy_out(off > free_d - regen_h ? static_cast<double>(off - (free_d - regen_h)) : 0.0);
          at_start = std::max(at_start, out_remake_or_copy(before_[j], dur_[j] + after));
          at_end = std::max(at_end, out_remake_or_copy(before_[j + 1], after));
        }
        const double v = std::max({at_start, at_end, late_chain(j, off, free_d - late_total, free_h, late_total)});
        if (v > best) {
          best = v;
          best_op = j;
        }
      }
      for (tensor_id x : op.reads) touched[x] = 0;
      for (tensor_id x : op.writes) touched[x] = 0;
      auto advance = [&](tensor_id x) {
        const auto& uses = r_.tensors[x].uses;
        while (next[x] < uses.size() && uses[next[x]].op <= j) {
          if (uses[next[x]].writes) last_write[x] = uses[next[x]].op;
          ++next[x];
        }
      };
      for (tensor_id x : op.reads) advance(x);
      for (tensor_id x : op.writes) advance(x);
    }
    return {best, best_op};
  }

 private:
  // The ops the bound is taken at: every op with needed bytes over the budget, or, when that
  // is too much work, those with the most and others spread evenly among the rest.
  std::vector<char> chosen_ops() const {
    std::vector<op_index> over;
    for (op_index j = 0; j < n_; ++j)
      if (r_.needed_bytes_during[j] > budget_) over.push_back(j);
    std::vector<char> chosen(n_, 0);
    const double scan = static_cast<double>(std::max<std::size_t>(1, t_.tensors.size()));
    const auto most = static_cast<std::size_t>(std::max(2.0, order_work_limit / scan));
    if (over.size() <= most) {
      for (op_index j : over) chosen[j] = 1;
      return chosen;
    }
    auto by_need = over;
    std::nth_element(by_need.begin(), by_need.begin() + static_cast<std::ptrdiff_t>(most / 2), by_need.end(),
                     [&](op_index a, op_index b) { return r_.needed_bytes_during[a] > r_.needed_bytes_during[b]; });
    for (std::size_t i = 0; i < most / 2; ++i) chosen[by_need[i]] = 1;
    const std::size_t spread = most - most / 2;
    for (std::size_t i = 0; i < spread; ++i) chosen[over[i * over.size() / spread]] = 1;
    return chosen;
  }

  // Part (f) of Note [Lower bound]: what a rerun of op w after op j owes for the values it
  // reads that nothing reads after op j (dead there), that only op w reads and whose writer
  // writes nothing else, each of at least `least` bytes, their writers' reruns first: seconds
  // of those reruns (with the writers' own chains), the earliest op among the writers, and
  // whether some writer cannot run again (blocked).
  struct chain_cost {
    double seconds = 0;
    std::size_t earliest = std::numeric_limits<std::size_t>::max();
    bool blocked = false;
  };
  chain_cost chain(op_index j, std::size_t w, std::uint64_t least, int depth, const std::vector<char>& touched,
                   const std::vector<std::size_t>& next, const std::vector<std::int64_t>& last_write) const {
    chain_cost c;
    c.earliest = w;
    if (depth >= max_chain_depth) return c;
    for (tensor_id y : t_.ops[w].reads) {
      const auto& ly = r_.tensors[y];
      const std::uint64_t by = t_.tensors[y].bytes;
      if (touched[y] || by < least || readers_[y] != 1 || last_write[y] < 0) continue;
      const bool y_next = next[y] < ly.uses.size();
      if (y_next ? ly.uses[next[y]].reads : ly.crosses_boundary) continue;  // needed: counted on its own
      const auto wy = static_cast<std::size_t>(last_write[y]);
      if (out_[wy] != by) continue;  // its writer writes more: left free
      c.earliest = std::min(c.earliest, wy);
      if (j >= until_[wy]) {
        c.blocked = true;
        continue;
      }
      const auto sub = chain(j, wy, least, depth + 1, touched, next, last_write);
      c.seconds += dur_[wy] + sub.seconds;
      c.earliest = std::min(c.earliest, sub.earliest);
      c.blocked |= sub.blocked;
    }
    return c;
  }

  struct item {
    std::size_t op;  // the write before (d_) or the read after (h_, g_)
    std::uint64_t bytes;
    double rate = 0;  // g_: seconds of the writer's rerun per byte it writes
  };

  // One copy queue's least time for x bytes of a list of items taken in its order: x / bw +
  // the largest fixed(op_i) - (bytes before item i) / bw over the items with fewer than x
  // bytes before them (the last one taken in part); the prefix peaks are built once.
  struct copy_curve {
    std::vector<double> before{0.0}, peak;
    double bw = 1;
    template <class F>
    void build(const std::vector<item>& items, double rate, F fixed) {
      bw = rate;
      before.assign(1, 0.0);
      peak.clear();
      for (const auto& it : items) {
        const double v = fixed(it.op) - before.back() / bw;
        peak.push_back(peak.empty() ? v : std::max(peak.back(), v));
        before.push_back(before.back() + static_cast<double>(it.bytes));
      }
    }
    double at(double x) const {
      x = std::min(x, before.back());
      if (x <= 0) return 0.0;
      const auto k = static_cast<std::size_t>(std::lower_bound(before.begin(), before.end(), x) - before.begin());
      return x / bw + peak[k - 1];  // items 0..k-1 are taken
    }
  };

  void prepare_split(std::uint64_t need) {
    need_ = static_cast<double>(need);
    auto later = [](const item& x, const item& y) { return x.op > y.op; };
    std::sort(h_.begin(), h_.end(), later);
    std::sort(g_.begin(), g_.end(), later);
    both_.resize(h_.size() + g_.size());
    std::merge(h_.begin(), h_.end(), g_.begin(), g_.end(), both_.begin(), later);
    // H(L): the copies in, latest read first, each before the compute from its read on.
    copy_in_.build(both_, hw_.h2d_bytes_per_s, [&](std::size_t r) { return before_[n_] - before_[r]; });
    // R(q): the values remade, cheapest share per byte first.
    std::sort(g_.begin(), g_.end(), [](const item& x, const item& y) { return x.rate < y.rate; });
    remade_before_.assign(1, 0.0);
    remade_secs_.assign(1, 0.0);
    for (const auto& it : g_) {
      remade_before_.push_back(remade_before_.back() + static_cast<double>(it.bytes));
      remade_secs_.push_back(remade_secs_.back() + static_cast<double>(it.bytes) * it.rate);
    }
  }

  // R(q): the rerun seconds of the q regenerable bytes remade, cheapest share per byte first.
  double remade(double q) const {
    if (q <= 0) return 0.0;
    const std::size_t i = remade_item(q);
    if (i >= g_.size()) return remade_secs_.back();
    return remade_secs_[i] + (q - remade_before_[i]) * g_[i].rate;
  }

  // R's slope just above q: the share per byte of the item q falls in (R is convex).
  double remade_slope(double q) const {
    const std::size_t i = remade_item(q);
    return i < g_.size() ? g_[i].rate : 0.0;
  }

  // The item of g_ (cheapest first) that the q-th byte remade falls in; g_.size() past the end.
  std::size_t remade_item(double q) const {
    return static_cast<std::size_t>(std::upper_bound(remade_before_.begin(), remade_before_.end(), q) -
                                    remade_before_.begin()) - 1;
  }

  // H(l): the least time from the instant to the end of the step when l bytes of h_ and g_
  // come back by copies in, latest read first.
  double copied(double l) const { return copy_in_.at(l); }

  // Part (d) of the order bound, after prepare_split(need): the least time from the instant
  // to the end of the step when `need` bytes that are off come back in this iteration, each by
  // a copy in (h_ and g_, latest read first, as h2d_after) or, for the regenerable ones (g_),
  // by a rerun of its writer, which adds its share of the writer's time to the `compute` still
  // to run. With q the bytes remade (cheapest share first: R(q)) and the rest copied
  // (H(need - q)), the least over q of max(compute + R(q), H(need - q)); the copy side may pick
  // bytes the rerun side also took, which only lowers it.
  double remake_or_copy(double compute) const {
    if (need_ <= 0) return 0;
    const double top = std::min(remade_before_.back(), need_);
    // f(q) = compute + R(q) rises, g(q) = H(need - q) falls. If f(lo) <= g(lo) and
    // f(hi) >= g(hi), every q gives at least max(f(lo), g(hi)): below lo g is larger, above hi
    // f is, between them both are. Bisection closes [lo, hi] on the crossing.
    auto f = [&](double q) { return compute + remade(q); };
    auto g = [&](double q) { return copied(need_ - q); };
    if (f(0) >= g(0)) return f(0);
    if (f(top) <= g(top)) return g(top);
    double lo = 0, hi = top;
    for (int i = 0; i < 60 && hi - lo > top * 1e-12; ++i) {
      const double mid = 0.5 * (lo + hi);
      (f(mid) <= g(mid) ? lo : hi) = mid;
    }
    return std::max(f(lo), g(hi));
  }

  // For (e) of Note [Lower bound], after prepare_split: D(x), the copies out of the values of
  // d_ and the regenerable ones (gd_), earliest written first, each after the compute through
  // its write (as d2h_before), for `owed` bytes off that are neither free nor remade.
  void prepare_copy_out(double owed) {
    owed_ = owed;
    out_items_.assign(d_.begin(), d_.end());
    out_items_.insert(out_items_.end(), gd_.begin(), gd_.end());
    std::sort(out_items_.begin(), out_items_.end(), [](const item& a, const item& b) { return a.op < b.op; });
    copy_out_.build(out_items_, hw_.d2h_bytes_per_s, [&](std::size_t w) { return before_[w + 1]; });
  }

  double copied_out(double x) const { return copy_out_.at(x); }

  // Part (e) of the order bound: (d) with the copies out that its copied values owe. With q
  // the regenerable bytes remade, the least over q in [0, top] of F(q) = max(`ready`,
  // D(owed - q)) + max(`compute` + R(q), H(need - q)). On a piece [qa, qb] of that range:
  // D(x) = x / bw + a step that does not fall as x grows, so D(owed - q) >= (owed - q) / bw +
  // the step at owed - qb; R is convex (cheapest first), so R(q) >= R(qa) + (q - qa) R'(qa);
  // and H(need - q) >= H(need - qb). The least of that piecewise linear floor over the piece is
  // at an end or a corner. The least floor over the pieces of a split of [0, top] is a bound;
  // splitting the piece with the least floor, again and again, raises it toward min F.
  double out_remake_or_copy(double ready, double compute) const {
    if (need_ <= 0 && owed_ <= 0) return 0;
    const double top = remade_before_.back();
    const double bw = hw_.d2h_bytes_per_s, out_all = copy_out_.before.back();
    auto floor_on = [&](double qa, double qb) {
      const double xa = owed_ - qa, xb = owed_ - qb, hb = copied(need_ - qb), ra = compute + remade(qa);
      const double slope = remade_slope(qa);
      // D's floor: 0 where no copy out is owed; the exact value where the cap on bytes binds.
      const bool linear = xb > 0 && xa <= out_all;
      const double step = linear ? copied_out(xb) - xb / bw : 0.0;
      auto at = [&](double q) {
        const double d = linear ? (owed_ - q) / bw + step : copied_out(owed_ - qb);
        return std::max(ready, d) + std::max(ra + (q - qa) * slope, hb);
      };
      double least = std::min(at(qa), at(qb));
      if (linear) {
        const double q1 = owed_ - (ready - step) * bw;  // where the D floor meets `ready`
        if (q1 > qa && q1 < qb) least = std::min(least, at(q1));
      }
      if (slope > 0) {
        const double q2 = qa + (hb - ra) / slope;  // where the rerun side meets the copies in
        if (q2 > qa && q2 < qb) least = std::min(least, at(q2));
      }
      return least;
    };
    if (top <= 0) return floor_on(0, 0);
    struct span {
      double qa, qb, v;
      bool operator>(const span& o) const { return v > o.v; }
    };
    std::priority_queue<span, std::vector<span>, std::greater<span>> pieces;
    constexpr int first = 16, splits = 112;
    for (int i = 0; i < first; ++i) {
      const double qa = top * i / first, qb = top * (i + 1) / first;
      pieces.push({qa, qb, floor_on(qa, qb)});
    }
    for (int k = 0; k < splits; ++k) {
      const span low = pieces.top();
      pieces.pop();
      const double mid = 0.5 * (low.qa + low.qb);
      pieces.push({low.qa, mid, floor_on(low.qa, mid)});
      pieces.push({mid, low.qb, floor_on(mid, low.qb)});
    }
    return pieces.top().v;
  }

  // Least time the D2H queue needs to have copied out `need` bytes of values written at the ops
  // in d_ (each copy starts after its op ends, so after the compute up to it): the earliest
  // written ones, a part of the last one.
  double d2h_before(std::uint64_t need) {
    return least(d_, need, false, hw_.d2h_bytes_per_s, [&](std::size_t w) { return before_[w + 1]; });
  }

  // Least time from the moment `need` bytes are off to the end of the step when they must come
  // back before their reads at the ops in h_ (the H2D of what op k reads ends before op k
  // starts, and ops k.. still run): the ones read latest, a part of the first one.
  double h2d_after(std::uint64_t need) {
    return least(h_, need, true, hw_.h2d_bytes_per_s, [&](std::size_t r) { return before_[n_] - before_[r]; });
  }

  // Part (c) of the order bound at the start of op j: `off` bytes are off, `free` of them may
  // owe no copy out at all, and up to `late` bytes (l_) are values of the previous iteration
  // that the iteration writes again and the next one reads: each either copied out before op j
  // (with the values of d_) or copied out after its last write. Takes the least over how many
  // bytes go late, on a grid: the pre side falls and the late side grows with them.
  double late_chain(op_index j, std::uint64_t off, std::uint64_t free, std::uint64_t free_h, std::uint64_t late) {
    if (late == 0) return 0;
    std::sort(d_.begin(), d_.end(), [](const item& a, const item& b) { return a.op < b.op; });
    std::sort(h_.begin(), h_.end(), [](const item& a, const item& b) { return a.op < b.op; });
    std::sort(l_.begin(), l_.end(), [](const item& a, const item& b) { return a.op < b.op; });
    const double after = before_[n_] - before_[j + 1];
    constexpr int grid = 8;
    double best = std::numeric_limits<double>::infinity();
    double h_prev = h2d_with_late(off, free_h, 0);
    for (int i = 0; i < grid; ++i) {
      const double lam_hi = static_cast<double>(late) * (i + 1) / grid;
      const double d = d2h_with_pre(static_cast<double>(off) - static_cast<double>(free) - lam_hi,
                                    static_cast<double>(late) - lam_hi);
      const double at_start = std::max(before_[j], d) + std::max(dur_[j] + after, h_prev);
      const double at_end = std::max(before_[j + 1], d) + std::max(after, h_prev);
      best = std::min(best, std::max(at_start, at_end));
      h_prev = h2d_with_late(off, free_h, lam_hi);
    }
    return best;
  }

  // Least D2H time before the instant when `need` bytes must have been copied out: up to `pre`
  // of them held since before the iteration (ready once op 0 ends: an eviction follows an op),
  // the rest values in d_ (sorted by the op that wrote them), earliest written first.
  double d2h_with_pre(double need, double pre) const {
    if (need <= 0) return 0;
    const double bw = hw_.d2h_bytes_per_s;
    double rest = need - std::min(pre, need), out = before_[1] + need / bw;  // copies out follow op 0
    double taken = 0;
    std::vector<double> take;
    for (const auto& it : d_) {
      if (taken >= rest) break;
      take.push_back(std::min(static_cast<double>(it.bytes), rest - taken));
      taken += take.back();
    }
    double suffix = taken;
    for (std::size_t i = 0; i < take.size(); ++i) {
      out = std::max(out, before_[d_[i].op + 1] + suffix / bw);
      suffix -= take[i];
    }
    return out;
  }

  // Least time from the instant to the end of the step when the `off` bytes (less `free_h`
  // that need no copy in) come back before their reads (h_, latest read first) and `lam`
  // bytes of l_ (earliest last write first) are copied out after their last write: for every
  // op k, the copies in of what ops <= k read end before op k starts; after that start the
  // compute from k still runs, and so do op k and then the copies out of what ops >= k last
  // write (those copies start when their writing op ends, at or after the end of op k).
  double h2d_with_late(std::uint64_t off, std::uint64_t free_h, double lam) const {
    const double need = off > free_h ? static_cast<double>(off - free_h) : 0.0;
    double avail_after = 0;  // bytes of h_ read after k
    for (const auto& it : h_) avail_after += static_cast<double>(it.bytes);
    double late_before = 0;  // bytes of l_ last written before k
    double out = 0;
    std::size_t hi = 0, li = 0;
    while (hi < h_.size() || li < l_.size()) {
      const std::size_t k = li >= l_.size() || (hi < h_.size() && h_[hi].op <= l_[li].op) ? h_[hi].op : l_[li].op;
      while (hi < h_.size() && h_[hi].op <= k) avail_after -= static_cast<double>(h_[hi++].bytes);
      const double in = std::max(0.0, need - avail_after);
      const double late_here = std::max(0.0, lam - late_before);
      out = std::max(out, in / hw_.h2d_bytes_per_s +
                              std::max(before_[n_] - before_[k], dur_[k] + late_here / hw_.d2h_bytes_per_s));
      while (li < l_.size() && l_[li].op <= k) late_before += static_cast<double>(l_[li++].bytes);
    }
    return out;
  }

  // Takes `need` bytes of `v` in op order (latest first when `latest`), and returns the largest
  // fixed(op_i) + (bytes taken at i and after)/bw over the items taken.
  template <class F>
  static double least(std::vector<item>& v, std::uint64_t need, bool latest, double bw, F fixed) {
    if (need == 0) return 0;
    std::sort(v.begin(), v.end(), [latest](const item& a, const item& b) { return latest ? a.op > b.op : a.op < b.op; });
    copy_curve c;
    c.build(v, bw, fixed);
    return c.at(static_cast<double>(need));
  }


  const trace& t_;
  const lifetime_report& r_;
  const hw_profile& hw_;
  std::uint64_t budget_;
  std::size_t n_;
  std::vector<op_index> until_;  // detail::remake_until
  std::vector<double> dur_, rate_, before_;  // rate_[w]: op w's seconds per byte it writes
  std::vector<std::uint64_t> out_;  // bytes each op writes
  std::vector<std::uint32_t> readers_;  // ops that read each tensor
  static constexpr int max_chain_depth = 8;
  std::vector<item> d_, h_, l_, g_, both_;
  std::vector<item> gd_;  // the regenerable values of g_, by the op that wrote them
  std::vector<item> out_items_;  // d_ and gd_, earliest written first (prepare_copy_out)
  // prepare_split's curves: H over both_ (latest read first), and the bytes and rerun seconds
  // before each item of g_ (cheapest first).
  double need_ = 0;
  copy_curve copy_in_;
  std::vector<double> remade_before_, remade_secs_;
  double owed_ = 0;  // prepare_copy_out: bytes off that owe a copy out unless remade
  copy_curve copy_out_;  // D over out_items_
};

}  // namespace

namespace {
bounds device_bounds(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) {
  bounds b;
  for (const auto& op : t.ops) b.ideal_seconds += hw.op_seconds(op);
  // Family (1): the least time the link and NVMe need for `f`'s bytes.
  auto volume = [&](const transfer_floor& f) {
    const double h2d = static_cast<double>(f.h2d_bytes) / hw.h2d_bytes_per_s;
    const double d2h = static_cast<double>(f.d2h_bytes) / hw.d2h_bytes_per_s;
    const double link = hw.copy_engines >= 2 ? std::max(h2d, d2h) : h2d + d2h;
    return std::max({link, static_cast<double>(f.nvme_read_bytes) / hw.nvme_read_bytes_per_s,
                     static_cast<double>(f.nvme_write_bytes) / hw.nvme_write_bytes_per_s});
  };
  const auto all = least_transfers(t, r, budget, hw.host_bytes);
  b.h2d_min_bytes = all.h2d_bytes;
  b.d2h_min_bytes = all.d2h_bytes;
  b.nvme_read_min_bytes = all.nvme_read_bytes;
  b.nvme_write_min_bytes = all.nvme_write_bytes;
  b.volume_bound_seconds = volume(all);
  transfer_floor_options state_only;
  state_only.persistent_only = true;
  b.state_bound_seconds = std::max(b.ideal_seconds, volume(least_transfers(t, r, budget, hw.host_bytes, state_only)));
  std::tie(b.order_bound_seconds, b.order_bound_op) = order_bound(t, r, hw, budget).run();
  const auto windows = detail::memory_window_bound(t, r, hw, budget);
  b.window_bound_seconds = windows.seconds;
  b.window_bound_op = windows.op;
  b.lower_bound_seconds = std::max(
      {b.ideal_seconds, b.volume_bound_seconds, b.order_bound_seconds, b.state_bound_seconds, b.window_bound_seconds});
  return b;
}
}  // namespace

// Note [Host placement bound]
// Where the profile runs host ops and the trace has host_capable ops, a plan may run any of
// them on the host (Note [Host ops] in prefetch/plan.hpp). Take the relaxed trace in which
// every host_capable op touches nothing and takes no time (detail::make_device_view over all of
// them). A plan P for the trace, with any set of ops on the host, gives a plan for the relaxed
// trace that is no slower: drop P's host ops and the device work of its host_capable ops; every
// device use the relaxed trace keeps is one P serves, within the same budget, and the copies P
// makes for the host are more than the relaxed trace asks for. So the relaxed trace's bounds
// hold for P, and the bounds reported are the lesser of the device-only ones and the relaxed
// ones (each figure: ideal, state and lower bound). The relaxation gives up what host ops cost
// (their time, the gradients' copies down, the weights' copies up): a weaker bound, still a bound.
bounds compute_bounds(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) {
  bounds b = device_bounds(t, r, hw, budget);
  if (!hw.runs_host_ops()) return b;
  std::vector<char> relaxed(t.ops.size(), 0);
  bool any = false;
  for (op_index k = 0; k < t.ops.size(); ++k) any |= (relaxed[k] = t.ops[k].host_capable ? 1 : 0) != 0;
  if (!any) return b;
  const auto v = detail::make_device_view(t, relaxed);
  const bounds h = device_bounds(v.t, v.r, hw, budget);
  if (h.lower_bound_seconds < b.lower_bound_seconds) {
    b.lower_bound_seconds = h.lower_bound_seconds;
    b.volume_bound_seconds = std::min(b.volume_bound_seconds, h.volume_bound_seconds);
    b.order_bound_seconds = h.order_bound_seconds;
    b.order_bound_op = h.order_bound_op;
    b.window_bound_seconds = h.window_bound_seconds;
    b.window_bound_op = h.window_bound_op;
    b.h2d_min_bytes = std::min(b.h2d_min_bytes, h.h2d_min_bytes);
    b.d2h_min_bytes = std::min(b.d2h_min_bytes, h.d2h_min_bytes);
    b.nvme_read_min_bytes = std::min(b.nvme_read_min_bytes, h.nvme_read_min_bytes);
    b.nvme_write_min_bytes = std::min(b.nvme_write_min_bytes, h.nvme_write_min_bytes);
  }
  b.ideal_seconds = std::min(b.ideal_seconds, h.ideal_seconds);
  b.state_bound_seconds = std::min(b.state_bound_seconds, h.state_bound_seconds);
  b.lower_bound_seconds = std::min(b.lower_bound_seconds, h.lower_bound_seconds);
  return b;
}

}  // namespace spillway::offload
