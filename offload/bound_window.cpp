// The memory-window bound (Note [Memory windows]).
#include "offload/bound_window.hpp"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <vector>

#include "offload/bound_transfer.hpp"
#include "offload/planner_range_max.hpp"

namespace spillway::offload::detail {

// Note [Memory windows]
// B is the budget, S_k the working set of op k (what it reads and writes; the device holds it
// all while op k runs), C(a..b) the compute of ops a..b. Take a value x that op j reads, its use
// before that at op p (or none: a value from the last iteration), and k, the last op in (p, j)
// with |S_k| + |x| > B. x is not on the device while op k runs, so it comes back after op k
// ends: by a copy in (device memory is taken when the copy is issued, and none is free for x
// until op k ends), |x| / h2d seconds before op j starts, or by a rerun of its writer w at some
// step in (k, j] (Note [Recomputation] in prefetch/plan.hpp).
// The rerun of an op w needs S_w on the device at once, and with it every value G that must
// stay: those op k touches, last written at op s_g <= k by an op that is not recomputable (so
// no rerun gives them back and no copy of them was made before s_g), and read again at op j or
// later with no write in between (or, past their last use, needed by the next iteration).
// Where |S_w u G| > B, values of G outside S_w with at least D = |S_w u G| - B bytes left the
// device before the rerun: a drop needs a valid copy, an eviction frees its memory when its
// copy out ends, and either way copies out of them began after op s_g and ended before op j:
// at least D / d2h seconds, or, where the values of G under D bytes hold less than D together,
// the least one of at least D bytes / d2h. The rerun also needs w's reads, each with the value
// w read: one on the device at op k, or with |S_k| + |y| <= B (it may have stayed there), costs
// nothing; another comes back after op k like x, by a copy or by a rerun of its writer, and so
// on up the chain (8 steps; beyond, free). A rerun of w is possible only before the first op after w that writes
// one of its reads (remake_until), so where that is op k or earlier only the copy is left. So
// with s = min(k, s_g over G), the stretch from the end of op s to the start of op j holds at
// least T seconds of copies, T the least over these ways (a way's copies in and copies out are
// each counted, the larger taken), while the compute stream runs at most ops s+1..j-1 (and
// reruns, which only add): the compute waits at least T - C(s+1..j-1) there. G may be any set of
// such values: the bound takes, for each x and j, the best of s = k and each s_g of the values
// written in the 16 ops up to k (G then all such values written at s or later).
// Windows that do not overlap (one's j at or before the other's s) add up: the compute stream
// runs every op once and waits in each window, so step >= C(all) + the most that a set of such
// windows gives (weighted interval scheduling over the windows, in order of j). Example:
// ResNet-50 at 1/8 of its peak on h200: layer1.2's input (189 MiB) cannot be on the device at
// layer1.2.bn3.bwd (567 MiB of 689), the gradient layer1.2.relu3.bwd writes stays until
// layer1.2.conv1.bwd reads the input, and the input's chain needs a 567 MiB add beside it: 3.97
// ms of copies beside 0.46 ms of compute, the same for layer1.1, so no plan takes under 20.9 ms
// (ideal 13.9, the other families 17.0).

namespace {

constexpr int chain_steps = 8;           // rerun chain looked at, as in Note [Lower bound] (f)
constexpr op_index window_lookback = 16;  // how far before op k a value of G may be written

struct window {
  op_index s = 0, j = 0;
  double wait = 0;
};

bool touches(const op_desc& op, tensor_id x) {
  return std::find(op.reads.begin(), op.reads.end(), x) != op.reads.end() ||
         std::find(op.writes.begin(), op.writes.end(), x) != op.writes.end();
}

class windows {
 public:
  windows(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget)
      : t_(t), r_(r), hw_(hw), budget_(budget), n_(t.ops.size()), until_(remake_until(t, r)) {
    before_.assign(n_ + 1, 0);
    for (op_index k = 0; k < n_; ++k) before_[k + 1] = before_[k] + hw.op_seconds(t.ops[k]);
    in_op_.assign(t.tensors.size(), 0);
  }

  window_bound run() {
    std::vector<std::int64_t> ws(n_);
    for (op_index k = 0; k < n_; ++k) ws[k] = static_cast<std::int64_t>(r_.working_set_bytes[k]);
    const range_max tree(ws);
    std::vector<window> found;
    for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
      const auto& uses = r_.tensors[x].uses;
      const auto bx = static_cast<std::int64_t>(t_.tensors[x].bytes);
      const double copy = static_cast<double>(bx) / hw_.h2d_bytes_per_s;
      for (std::size_t i = 0; i < uses.size(); ++i) {
        if (!uses[i].reads) continue;
        if (i == 0 && !r_.tensors[x].crosses_boundary) continue;  // a value from before the iteration
        const op_index j = uses[i].op;
        const op_index lo = i == 0 ? 0 : uses[i - 1].op + 1;
        const auto k = tree.last_above(lo, j, static_cast<std::int64_t>(budget_) - bx);
        if (k < 0) continue;
        const auto ku = static_cast<op_index>(k);
        if (copy <= compute(ku + 1, j)) continue;  // no s <= k leaves a wait
        const auto w = best_window(x, ku, j, copy);
        if (w.wait > 0) found.push_back(w);
      }
    }
    return schedule(std::move(found));
  }

 private:
  double compute(op_index a, op_index b) const { return a < b ? before_[b] - before_[a] : 0; }  // ops a..b-1

  // The last op at or before k that writes x in this iteration, or -1.
  std::int64_t writer_before(tensor_id x, op_index k) const {
    std::int64_t w = -1;
    for (const auto& u : r_.tensors[x].uses) {
      if (u.op > k) break;
      if (u.writes) w = u.op;
    }
    return w;
  }

  // Whether the value x holds after op k is read at op j or later before any write (or, past
  // its last use, by the next iteration), no op in (k, j) writing it.
  bool needed_from(tensor_id x, op_index k, op_index j) const {
    for (const auto& u : r_.tensors[x].uses) {
      if (u.op <= k) continue;
      if (u.op >= j) return u.reads;
      if (u.writes) return false;
    }
    return r_.tensors[x].crosses_boundary;
  }

  struct held {
    tensor_id g;
    op_index written;
  };

  window best_window(tensor_id x, op_index k, op_index j, double copy) {
    const auto& op = t_.ops[k];
    std::vector<held> cands;
    auto consider = [&](tensor_id g) {
      if (g == x || in_op_[g]) return;
      in_op_[g] = 1;
      const auto w = writer_before(g, k);
      if (w < 0 || k - static_cast<op_index>(w) > window_lookback || t_.ops[static_cast<op_index>(w)].recomputable) return;
      if (needed_from(g, k, j)) cands.push_back({g, static_cast<op_index>(w)});
    };
    for (tensor_id g : op.reads) consider(g);
    for (tensor_id g : op.writes) consider(g);
    for (tensor_id g : op.reads) in_op_[g] = 0;
    for (tensor_id g : op.writes) in_op_[g] = 0;
    std::vector<op_index> starts{k};
    for (const auto& c : cands) starts.push_back(c.written);
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    window best{k, j, 0};
    for (op_index s : starts) {
      g_.clear();
      for (const auto& c : cands)
        if (c.written >= s) g_.push_back(c.g);
      memo_.clear();
      const double t = value_seconds(x, j, k, 0, copy);
      const double wait = t - compute(s + 1, j);
      if (wait > best.wait) best = {s, j, wait};
    }
    return best;
  }

  // The least copy time after op k that brings back y, which op `reader` (> k, or a rerun after
  // k) reads, the values of g_ staying where they are not copied out (Note [Memory windows]).
  double value_seconds(tensor_id y, op_index reader, op_index k, int depth, double copy) {
    const auto w = reader == 0 ? std::int64_t{-1} : writer_before(y, reader - 1);
    if (w < 0 || !t_.ops[static_cast<op_index>(w)].recomputable || until_[static_cast<op_index>(w)] <= k) return copy;
    if (depth >= chain_steps) return 0;
    const auto key = (static_cast<std::uint64_t>(y) << 32) | static_cast<std::uint64_t>(w);
    if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
    memo_[key] = 0;  // a cycle cannot occur (writers come first), but stay safe
    const auto wo = static_cast<op_index>(w);
    double t = evict_seconds(wo);
    const auto& wop = t_.ops[wo];
    const auto& kop = t_.ops[k];
    for (tensor_id z : wop.reads) {
      if (t >= copy) break;
      if (touches(kop, z) || r_.working_set_bytes[k] + t_.tensors[z].bytes <= budget_) continue;  // may have stayed
      t = std::max(t, value_seconds(z, wo, k, depth + 1, static_cast<double>(t_.tensors[z].bytes) / hw_.h2d_bytes_per_s));
    }
    t = std::min(t, copy);
    memo_[key] = t;
    return t;
  }

  // The copy out that a rerun of op w forces on the values of g_ (infinite where none helps).
  double evict_seconds(op_index w) const {
    const auto& op = t_.ops[w];
    std::uint64_t need = r_.working_set_bytes[w];
    sizes_.clear();
    for (tensor_id g : g_) {
      if (touches(op, g)) continue;
      need += t_.tensors[g].bytes;
      sizes_.push_back(t_.tensors[g].bytes);
    }
    if (need <= budget_) return 0;
    // The values that leave free at least `deficit` bytes. Where those smaller than the deficit
    // cannot do it together, one at least as large goes: the least such one; else the deficit.
    const std::uint64_t deficit = need - budget_;
    std::uint64_t small = 0, least_large = std::numeric_limits<std::uint64_t>::max();
    for (auto b : sizes_) {
      if (b < deficit) small += b;
      else least_large = std::min(least_large, b);
    }
    if (small >= deficit) return static_cast<double>(deficit) / hw_.d2h_bytes_per_s;
    if (least_large == std::numeric_limits<std::uint64_t>::max()) return std::numeric_limits<double>::infinity();
    return static_cast<double>(least_large) / hw_.d2h_bytes_per_s;
  }

  // The set of windows, no two overlapping, with the most wait (by their ends).
  window_bound schedule(std::vector<window> ws) const {
    window_bound out;
    out.seconds = before_[n_];
    if (ws.empty()) return out;
    std::sort(ws.begin(), ws.end(), [](const window& a, const window& b) { return a.j < b.j; });
    std::vector<double> best(ws.size() + 1, 0);  // best[i]: the first i windows
    std::vector<op_index> ends(ws.size());
    for (std::size_t i = 0; i < ws.size(); ++i) ends[i] = ws[i].j;
    for (std::size_t i = 0; i < ws.size(); ++i) {
      // Windows before i that end at or before this one's start: the first p of them.
      const auto first = ends.begin();
      const auto p = static_cast<std::size_t>(std::upper_bound(first, first + static_cast<std::ptrdiff_t>(i), ws[i].s) - first);
      best[i + 1] = std::max(best[i], best[p] + ws[i].wait);
    }
    out.wait_seconds = best[ws.size()];
    out.seconds += out.wait_seconds;
    out.op = std::max_element(ws.begin(), ws.end(), [](const window& a, const window& b) { return a.wait < b.wait; })->j;
    return out;
  }

  const trace& t_;
  const lifetime_report& r_;
  const hw_profile& hw_;
  std::uint64_t budget_;
  std::size_t n_;
  std::vector<op_index> until_;
  std::vector<double> before_;    // before_[k]: compute of ops < k
  std::vector<char> in_op_;       // scratch: tensors of op k already looked at
  std::vector<tensor_id> g_;      // the values that stay (G)
  mutable std::vector<std::uint64_t> sizes_;  // scratch of evict_seconds
  std::unordered_map<std::uint64_t, double> memo_;
};

}  // namespace

window_bound memory_window_bound(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) {
  if (t.ops.empty() || !(hw.h2d_bytes_per_s > 0) || !(hw.d2h_bytes_per_s > 0)) return {};
  return windows(t, r, hw, budget).run();
}

}  // namespace spillway::offload::detail
