// The optimal reference planner: builds the keep / swap / recompute program of Note [Optimal
// MILP], solves it (bench/milp.hpp: CBC or GLPK) under a time limit, turns the solution into a
// plan and simulates it.
#include "bench/plan_optimal.hpp"

#include "bench/milp.hpp"
#include "offload/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

namespace spillway::bench {

/// Note [Optimal MILP]
/// Stages are the ops, plus one last stage for the copies still running when the last op ends.
/// Every idle gap of a tensor (the ops strictly between two uses, and for a persistent tensor
/// the gap over the iteration boundary) gets its own decision: stay resident, or go off the
/// device right after the use before the gap and come back for the use after it. Going off
/// issues the eviction after that use: a copy to the host tier (O), or a drop when the value is
/// not needed, the host already holds it (V: a copy made since the last write, or the starting
/// copy of a persistent tensor whose home is the host) or it comes back by recomputation. Per
/// stage of the gap two monotone binaries say whether its memory is free by then (P: the copy
/// out has finished, or the drop) and whether it is back (Q: a prefetch issued by then), so the
/// tensor holds memory at stage j exactly when 1 - P_j + Q_j. It comes back for the use after
/// the gap by a prefetch (Q) or by rerunning its writer before that use (Y, which needs the
/// rerun C[w][use]; the rerun needs its own reads resident then, or rerun too: chains up to
/// three ops deep). Memory: at every stage the tensors that hold memory, the working set and
/// what reruns allocate fit the budget. Time: each stage takes
///   T_j >= max(serial H2D, serial D2H) + op + reruns,  T_j >= H2D in the stage,  T_j >= D2H in the stage
/// where a copy out is spread over the stages between its eviction and the stage its memory is
/// free (what is left at that stage waits, serial), and a prefetch over the stages between its
/// issue and its use (issued right before its use: serial). The objective is sum T_j.
/// Simplifications, so the program stays small: the smallest tensors (together at most 0.5% of
/// the budget) and metrics always stay resident, evictions happen right after a use, a rerun
/// runs right before the use it serves, the host tier is the only tier (no NVMe) and its
/// capacity is left to the simulator. So "optimal" is optimal for this program, and the gap is
/// against its bound: a plan outside it (another planner's) may simulate faster.
/// The model against the simulator: memory is counted at least as the simulator holds it (a
/// copy out holds its memory until P says free), so the plan keeps the budget. Copies are a
/// fluid in the model (any share of a stage's link time goes to any copy whose window covers
/// the stage), while the simulator's queues are first in, first out: a copy issued early for a
/// late use delays one issued later for an earlier use. So the simulated step may be longer than
/// the program's objective; the bench reports both, and the simulated one as the step.

namespace {

using offload::hw_profile;
using offload::lifetime_report;

/// A linear expression over columns (numbered from 1) plus a constant.
struct lin {
  double c = 0;
  std::vector<std::pair<int, double>> t;
  lin& add(int col, double v) {
    if (col > 0 && v != 0) t.emplace_back(col, v);
    return *this;
  }
  lin& add(const lin& o, double s = 1) {
    c += s * o.c;
    for (auto [col, v] : o.t) t.emplace_back(col, s * v);
    return *this;
  }
  [[nodiscard]] double value(const std::vector<double>& x) const {
    double s = c;
    for (auto [col, v] : t) s += v * x[col];
    return s;
  }
};

/// One idle gap of one tensor and its columns (0: none). Positions are the stages of the gap
/// in order; for the gap over the boundary: the stages after the last use, the end stage
/// (index `end_pos`), then the stages before the first use.
struct gap_vars {
  tensor_id x = 0;
  op_index after = 0, use = 0;  // the uses around the gap (for the boundary gap: last, first)
  bool wraps = false, needed = false;
  std::vector<std::uint32_t> stage;  // per position; n = the end stage
  int end_pos = -1;                  // wrap only
  std::vector<int> P, Q;             // per position; Q has one more entry: at the use
  std::vector<int> d, ds, g;         // per position
  int O = 0, V = 0, Y = 0;
  op_index writer = 0;  // the op whose rerun Y asks for
  [[nodiscard]] int off() const { return wraps ? P[end_pos] : P.back(); }
};

class builder {
 public:
  builder(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget)
      : t_(t), r_(r), hw_(hw), budget_(budget), n_(static_cast<std::uint32_t>(t.ops.size())) {}

  std::optional<optimal_result> run(double time_limit_s, std::string* why, const std::string& solver);

 private:
  int col(double lo, double hi, bool binary) {
    lo_.push_back(lo);
    hi_.push_back(hi);
    bin_.push_back(binary);
    return static_cast<int>(lo_.size());
  }
  void ge(const lin& e, double rhs) { rows_.push_back({e, rhs - e.c}); }  // e >= rhs
  void le(const lin& e, double rhs) {
    lin m;
    m.add(e, -1);
    ge(m, -rhs);
  }
  double ms_of(std::uint64_t bytes, double rate) const { return static_cast<double>(bytes) / rate * 1e3; }
  double mib(std::uint64_t bytes) const { return static_cast<double>(bytes) / 1048576.0; }

  void choose_fixed();
  void make_gaps();
  void make_gap(tensor_id x, op_index after, op_index use, bool wraps, bool needed);
  void make_recompute_candidates();
  bool rerun_valid(op_index w, op_index b) const;
  std::optional<op_index> last_writer_before(tensor_id x, op_index k, bool inclusive) const;
  lin resident(tensor_id x, std::uint32_t j) const;
  lin usable(tensor_id x, std::uint32_t j) const;
  void make_validity();
  void make_rows();
  std::vector<double> start_from(const plan* p) const;
  plan make_plan(const std::vector<double>& v) const;

  const trace& t_;
  const lifetime_report& r_;
  const hw_profile& hw_;
  std::uint64_t budget_;
  std::uint32_t n_;

  std::vector<bool> fixed_;           // per tensor: always resident in its live range
  std::vector<gap_vars> gaps_;
  std::vector<std::vector<std::int32_t>> where_;  // per tensor, per stage: -1 dead, -2 used/fixed, else gap*4096+pos
  std::map<std::pair<op_index, std::uint32_t>, int> rerun_;  // (op, stage) -> column C
  std::vector<int> T_;                // per stage 0..n
  std::vector<double> lo_, hi_;
  std::vector<bool> bin_;
  struct row {
    lin e;
    double lo;
  };
  std::vector<row> rows_;
  std::vector<lin> mem_;              // per stage: bytes (MiB) held
  std::vector<std::vector<lin>> time_rows_;  // per stage: T_j >= each
};

void builder::choose_fixed() {
  fixed_.assign(t_.tensors.size(), false);
  std::vector<tensor_id> order(t_.tensors.size());
  for (tensor_id x = 0; x < order.size(); ++x) {
    order[x] = x;
    if (!may_leave_device(t_.tensors[x].kind)) fixed_[x] = true;
  }
  std::sort(order.begin(), order.end(), [&](tensor_id a, tensor_id b) { return t_.tensors[a].bytes < t_.tensors[b].bytes; });
  std::uint64_t sum = 0;
  for (tensor_id x : order) {
    sum += t_.tensors[x].bytes;
    if (sum * 200 > budget_) break;
    fixed_[x] = true;
  }
}

std::optional<op_index> builder::last_writer_before(tensor_id x, op_index k, bool inclusive) const {
  std::optional<op_index> w;
  for (const auto& u : r_.tensors[x].uses) {
    if (u.op > k || (!inclusive && u.op == k)) break;
    if (u.writes) w = u.op;
  }
  return w;
}

bool builder::rerun_valid(op_index w, op_index b) const {
  if (!t_.ops[w].recomputable || b <= w) return false;
  auto changed = [&](tensor_id z) {
    for (const auto& u : r_.tensors[z].uses)
      if (u.writes && u.op > w && u.op < b) return true;
    return false;
  };
  for (tensor_id z : t_.ops[w].reads)
    if (changed(z)) return false;
  for (tensor_id z : t_.ops[w].writes)
    if (changed(z)) return false;
  return true;
}

void builder::make_gap(tensor_id x, op_index after, op_index use, bool wraps, bool needed) {
  gap_vars g;
  g.x = x;
  g.after = after;
  g.use = use;
  g.wraps = wraps;
  g.needed = needed;
  if (wraps) {
    for (std::uint32_t j = after + 1; j < n_; ++j) g.stage.push_back(j);
    g.end_pos = static_cast<int>(g.stage.size());
    g.stage.push_back(n_);
    for (std::uint32_t j = 0; j < use; ++j) g.stage.push_back(j);
  } else {
    for (std::uint32_t j = after + 1; j < use; ++j) g.stage.push_back(j);
  }
  const int m = static_cast<int>(g.stage.size());
  const double out_ms = ms_of(t_.tensors[x].bytes, hw_.d2h_bytes_per_s);
  const double in_ms = ms_of(t_.tensors[x].bytes, hw_.h2d_bytes_per_s);
  // P: free by position k (monotone); in the boundary gap it is settled at the end stage.
  const int p_last = wraps ? g.end_pos : m - 1;
  g.P.assign(m, 0);
  for (int k = 0; k <= p_last; ++k) {
    g.P[k] = col(0, 1, true);
    if (k > 0) ge(lin{}.add(g.P[k], 1).add(g.P[k - 1], -1), 0);
  }
  for (int k = p_last + 1; k < m; ++k) g.P[k] = g.P[p_last];
  const int off = g.P[p_last];
  if (needed) {
    // Q: back by position k (monotone, only after it went off; only past the boundary when it wraps).
    g.Q.assign(m + 1, 0);
    const int first_q = wraps ? g.end_pos + 1 : 1;
    for (int k = first_q; k <= m; ++k) {
      g.Q[k] = col(0, 1, true);
      if (k > first_q) ge(lin{}.add(g.Q[k], 1).add(g.Q[k - 1], -1), 0);
      le(lin{}.add(g.Q[k], 1).add(g.P[k - 1], -1), 0);
    }
    // Y: back by a rerun of the op that wrote the value, right before the use.
    if (!wraps) {
      if (auto w = last_writer_before(x, after, true); w && rerun_valid(*w, use)) {
        g.writer = *w;
        g.Y = col(0, 1, true);
      }
    }
    lin back;
    back.add(g.Q[m], 1).add(g.Y, 1).add(off, -1);
    ge(back, 0);
    le(back, 0);
    g.O = col(0, 1, true);
    le(lin{}.add(g.O, 1).add(off, -1), 0);
    g.V = col(0, 1, false);
    le(lin{}.add(g.Q[m], 1).add(g.V, -1), 0);
    // Copy in: spread over the positions from its issue to before the use.
    g.g.assign(m, 0);
    lin in_sum;
    for (int k = first_q; k < m; ++k) {
      g.g[k] = col(0, in_ms, false);
      le(lin{}.add(g.g[k], 1).add(g.Q[k], -in_ms), 0);
      in_sum.add(g.g[k], 1);
    }
    if (m - 1 >= first_q) ge(in_sum.add(g.Q[m - 1], -in_ms), 0);
    // Copy out: spread over the positions before its memory is free; the rest waits at that stage.
    g.d.assign(m, 0);
    g.ds.assign(m, 0);
    lin out_sum;
    for (int k = 0; k <= p_last; ++k) {
      g.d[k] = col(0, out_ms, false);
      if (!(wraps && k == g.end_pos)) le(lin{}.add(g.d[k], 1).add(g.P[k], out_ms), out_ms);
      out_sum.add(g.d[k], 1);
      if (wraps && k == g.end_pos) continue;
      g.ds[k] = col(0, out_ms, false);
      lin s;
      s.add(g.ds[k], 1).add(g.P[k], -out_ms);
      if (k > 0) s.add(g.P[k - 1], out_ms);
      le(s, 0);
      out_sum.add(g.ds[k], 1);
    }
    ge(out_sum.add(g.O, -out_ms), 0);
  }
  const auto id = static_cast<std::int32_t>(gaps_.size());
  for (int k = 0; k < m; ++k)
    if (g.stage[k] < n_) where_[x][g.stage[k]] = id * 4096 + k;
  gaps_.push_back(std::move(g));
}

void builder::make_gaps() {
  where_.assign(t_.tensors.size(), std::vector<std::int32_t>(n_ + 1, -1));
  for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
    const auto& lt = r_.tensors[x];
    const bool persistent = is_persistent(t_.tensors[x].kind);
    if (!lt.used()) continue;  // handled in the plan: an unused persistent tensor lives on the host
    auto& w = where_[x];
    const std::uint32_t from = persistent ? 0 : lt.first_use(), to = persistent ? n_ - 1 : lt.last_use();
    for (std::uint32_t j = from; j <= to; ++j) w[j] = -2;
    if (fixed_[x]) continue;
    const auto& uses = lt.uses;
    for (std::size_t i = 0; i + 1 < uses.size(); ++i)
      if (uses[i + 1].op > uses[i].op + 1) make_gap(x, uses[i].op, uses[i + 1].op, false, uses[i + 1].reads);
    if (persistent) make_gap(x, lt.last_use(), lt.first_use(), true, lt.crosses_boundary);
  }
}

// Whether x holds device memory during stage j, as an expression.
lin builder::resident(tensor_id x, std::uint32_t j) const {
  lin e;
  const auto w = where_[x][j];
  if (w == -2) {
    e.c = 1;
  } else if (w >= 0) {
    const auto& g = gaps_[w / 4096];
    const int k = w % 4096;
    e.c = 1;
    e.add(g.P[k], -1);
    if (g.needed) e.add(g.Q[k], 1);
  }
  return e;
}

// Whether x is on the device with its value during stage j (a copy out in flight holds memory
// but is not usable), as an expression.
lin builder::usable(tensor_id x, std::uint32_t j) const {
  lin e;
  const auto w = where_[x][j];
  if (w == -2) {
    e.c = 1;
  } else if (w >= 0) {
    const auto& g = gaps_[w / 4096];
    const int k = w % 4096;
    e.c = 1;
    e.add(g.off(), -1);
    if (g.needed) e.add(g.Q[k], 1);
  }
  return e;
}

void builder::make_recompute_candidates() {
  struct cand {
    op_index w;
    std::uint32_t b;
    int depth;
  };
  std::vector<cand> todo;
  for (const auto& g : gaps_)
    if (g.Y) todo.push_back({g.writer, g.use, 1});
  while (!todo.empty()) {
    const cand c = todo.back();
    todo.pop_back();
    if (rerun_.count({c.w, c.b})) continue;
    rerun_[{c.w, c.b}] = col(0, 1, true);
    if (c.depth >= 3) continue;
    for (tensor_id z : t_.ops[c.w].reads) {
      if (where_[z][c.b] == -2) continue;
      if (auto wz = last_writer_before(z, c.w, false); wz && rerun_valid(*wz, c.b)) todo.push_back({*wz, c.b, c.depth + 1});
    }
  }
  for (auto& g : gaps_)
    if (g.Y) le(lin{}.add(g.Y, 1).add(rerun_.at({g.writer, g.use}), -1), 0);
  for (const auto& [key, c] : rerun_) {
    const auto [w, b] = key;
    for (tensor_id z : t_.ops[w].reads) {
      lin need = usable(z, b);
      if (auto wz = last_writer_before(z, w, false); wz) {
        auto it = rerun_.find({*wz, b});
        if (it != rerun_.end()) need.add(it->second, 1);
      }
      need.add(c, -1);
      ge(need, 0);  // a rerun's read is resident, or rerun before it
    }
  }
}

void builder::make_validity() {
  // Per tensor, along its uses: V of a gap <= its copy out + the validity carried from the gap
  // before, which a write in between ends.
  std::vector<std::vector<const gap_vars*>> by_tensor(t_.tensors.size());
  for (const auto& g : gaps_)
    if (g.needed || g.wraps) by_tensor[g.x].push_back(&g);
  for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
    if (by_tensor[x].empty()) continue;
    const gap_vars* wrap = nullptr;
    std::map<op_index, const gap_vars*> after;
    for (auto* g : by_tensor[x]) {
      if (g->wraps) wrap = g;
      else after[g->after] = g;
    }
    lin cur;
    if (wrap && wrap->needed) cur.add(wrap->off(), 1);  // the home copy on the host
    for (const auto& u : r_.tensors[x].uses) {
      if (u.writes) cur = lin{};
      auto it = after.find(u.op);
      if (it == after.end() || !it->second->needed) continue;
      const auto* g = it->second;
      lin v;
      v.add(g->V, -1).add(g->O, 1).add(cur, 1);
      ge(v, 0);
      cur = lin{}.add(g->V, 1);
    }
    if (wrap && wrap->needed) {
      lin end;  // a home on the host ends with a valid copy there
      end.add(wrap->O, 1).add(cur, 1).add(wrap->off(), -1);
      ge(end, 0);
    }
  }
}

void builder::make_rows() {
  mem_.assign(n_, lin{});
  time_rows_.assign(n_ + 1, {});
  for (tensor_id x = 0; x < t_.tensors.size(); ++x)
    for (std::uint32_t j = 0; j < n_; ++j) mem_[j].add(resident(x, j), mib(t_.tensors[x].bytes));
  std::vector<lin> hser(n_ + 1), dser(n_ + 1), h2d(n_ + 1), d2h(n_ + 1), rec(n_ + 1);
  for (const auto& g : gaps_) {
    const int m = static_cast<int>(g.stage.size());
    if (!g.needed) continue;
    const double in_ms = ms_of(t_.tensors[g.x].bytes, hw_.h2d_bytes_per_s);
    hser[g.use].add(g.Q[m], in_ms).add(g.Q[m - 1], -in_ms);
    for (int k = 0; k < m; ++k) {
      h2d[g.stage[k]].add(g.g[k], 1);
      d2h[g.stage[k]].add(g.d[k], 1);
      dser[g.stage[k]].add(g.ds[k], 1);
    }
  }
  for (const auto& [key, c] : rerun_) {
    const auto [w, b] = key;
    rec[b].add(c, hw_.op_seconds(t_.ops[w]) * 1e3);
    for (tensor_id y : t_.ops[w].writes)
      if (where_[y][b] != -2) mem_[b].add(c, mib(t_.tensors[y].bytes));  // allocated by the rerun
  }
  const double budget = mib(budget_);
  for (std::uint32_t j = 0; j < n_; ++j) le(mem_[j], budget);
  for (std::uint32_t j = 0; j <= n_; ++j) {
    const double op_ms = j < n_ ? hw_.op_seconds(t_.ops[j]) * 1e3 : 0;
    auto& tr = time_rows_[j];
    tr.push_back(lin{}.add(hser[j]).add(rec[j]));
    tr.back().c += op_ms;
    tr.push_back(lin{}.add(dser[j]).add(rec[j]));
    tr.back().c += op_ms;
    if (hw_.copy_engines >= 2) {
      tr.push_back(lin{}.add(hser[j]).add(h2d[j]));
      tr.push_back(lin{}.add(dser[j]).add(d2h[j]));
    } else {
      tr.push_back(lin{}.add(hser[j]).add(h2d[j]).add(dser[j]).add(d2h[j]));
    }
    T_.push_back(col(op_ms, 1e30, false));
    for (const auto& e : tr) ge(lin{}.add(T_[j], 1).add(e, -1), 0);
  }
}

// A solution to start from. Without a plan: every gap off at once, a copy out that the next
// stage waits for and a prefetch right before the use, within the budget whenever the working
// sets are. With a plan (another planner's): the same for the gaps the plan leaves the device
// in, coming back where the plan's prefetch or rerun brings it. Empty when it breaks a row.
std::vector<double> builder::start_from(const plan* p) const {
  std::vector<double> v(lo_.size() + 1, 0);
  auto evicted_in = [&](const gap_vars& g) {
    if (g.wraps) return p->initial_tier[g.x] != tier::device;
    for (std::uint32_t s = g.after; s < g.use; ++s)
      for (const auto& e : p->steps[s].evictions)
        if (e.tensor == g.x) return true;
    return false;
  };
  for (const auto& g : gaps_) {
    if (p && !evicted_in(g)) continue;
    const int m = static_cast<int>(g.stage.size());
    for (int k = 0; k < m; ++k) v[g.P[k]] = 1;
    if (!g.needed) continue;
    const double out_ms = ms_of(t_.tensors[g.x].bytes, hw_.d2h_bytes_per_s);
    const double in_ms = ms_of(t_.tensors[g.x].bytes, hw_.h2d_bytes_per_s);
    if (p && g.Y) {
      const auto& rc = p->steps[g.use].recomputes;
      if (std::find(rc.begin(), rc.end(), g.writer) != rc.end()) {
        v[g.Y] = 1;
        continue;
      }
    }
    v[g.O] = 1;
    v[g.V] = 1;
    v[g.ds[0] ? g.ds[0] : g.d[0]] = out_ms;
    int k = m;  // where the copy back is issued
    if (p) {
      const int first_q = g.wraps ? g.end_pos + 1 : 1;
      for (int i = first_q; i < m && k == m; ++i)
        for (const auto& pf : p->steps[g.stage[i]].prefetches)
          if (pf.tensor == g.x && pf.use == g.use) k = i;
      if (k < m) v[g.g[k]] = in_ms;
    }
    for (int i = k; i <= m; ++i) v[g.Q[i]] = 1;
  }
  if (p)
    for (const auto& [key, c] : rerun_) {
      const auto& rc = p->steps[key.second].recomputes;
      if (std::find(rc.begin(), rc.end(), key.first) != rc.end()) v[c] = 1;
    }
  // A copy out that the stage after its eviction would wait for instead overlaps the ops of the
  // gap while the budget lets it keep its memory (stage by stage, gap by gap).
  std::vector<double> mem(n_);
  for (std::uint32_t j = 0; j < n_; ++j) mem[j] = mem_[j].value(v);
  const double budget = mib(budget_);
  for (const auto& g : gaps_) {
    if (!g.O || v[g.O] < 0.5 || !g.ds[0]) continue;
    const int p_last = g.wraps ? g.end_pos : static_cast<int>(g.stage.size()) - 1;
    const double b = mib(t_.tensors[g.x].bytes);
    double left = v[g.ds[0]];
    int k = 0;
    double overlap = 0;
    while (overlap < left && k < p_last && mem[g.stage[k]] + b <= budget + 1e-9 && (!g.Q[k + 1] || v[g.Q[k + 1]] < 0.5))
      overlap += hw_.op_seconds(t_.ops[g.stage[k++]]) * 1e3;
    if (k == 0) continue;
    // keep the memory over positions 0..k-1 and copy there; what is left waits at position k
    v[g.ds[0]] = 0;
    for (int i = 0; i < k; ++i) {
      const double take = std::min(left, hw_.op_seconds(t_.ops[g.stage[i]]) * 1e3);
      v[g.d[i]] = take;
      left -= take;
      v[g.P[i]] = 0;
      mem[g.stage[i]] += b;
    }
    if (g.ds[k]) v[g.ds[k]] = left;
    else v[g.d[k]] += left;  // the end stage
  }
  for (std::uint32_t j = 0; j <= n_; ++j) {
    double tj = lo_[T_[j] - 1];
    for (const auto& e : time_rows_[j]) tj = std::max(tj, e.value(v));
    v[T_[j]] = tj;
  }
  for (const auto& r : rows_)
    if (r.e.value(v) - r.e.c < r.lo - 1e-6) return {};  // e.g. a rerun chain deeper than the program's
  return v;
}

plan builder::make_plan(const std::vector<double>& v) const {
  plan p = plan::empty_for(t_, "optimal", budget_);
  auto on = [&](int c) { return c > 0 && v[c] > 0.5; };
  for (tensor_id x = 0; x < t_.tensors.size(); ++x)
    if (is_persistent(t_.tensors[x].kind) && !r_.tensors[x].used()) p.initial_tier[x] = tier::host;
  for (const auto& g : gaps_) {
    if (!on(g.off())) continue;
    if (g.wraps) p.initial_tier[g.x] = tier::host;
    p.steps[g.after].evictions.push_back({g.x, on(g.O) ? evict_action::evict_to_host : evict_action::drop});
    if (!g.needed || !on(g.Q.back())) continue;
    std::size_t k = 0;
    while (!on(g.Q[k])) ++k;
    const std::uint32_t at = k < g.stage.size() ? g.stage[k] : g.use;
    p.steps[at].prefetches.push_back({g.x, tier::host, g.use});
  }
  for (const auto& [key, c] : rerun_)
    if (on(c)) p.steps[key.second].recomputes.push_back(key.first);
  for (tensor_id x = 0; x < t_.tensors.size(); ++x)
    if (!is_persistent(t_.tensors[x].kind) && r_.tensors[x].used())
      p.steps[r_.tensors[x].last_use()].evictions.push_back({x, evict_action::drop});
  // What a rerun allocates that the plan does not keep goes after the op it ran before.
  std::vector<bool> dev(t_.tensors.size(), false);
  for (tensor_id x = 0; x < t_.tensors.size(); ++x) dev[x] = p.initial_tier[x] == tier::device && is_persistent(t_.tensors[x].kind);
  for (std::uint32_t j = 0; j < n_; ++j) {
    auto& s = p.steps[j];
    std::sort(s.recomputes.begin(), s.recomputes.end());
    if (j > 0)
      for (const auto& e : p.steps[j - 1].evictions) dev[e.tensor] = false;
    for (const auto& pf : s.prefetches) dev[pf.tensor] = true;
    for (op_index w : s.recomputes)
      for (tensor_id y : t_.ops[w].writes) {
        const bool used_here = std::find_if(r_.tensors[y].uses.begin(), r_.tensors[y].uses.end(),
                                            [&](const offload::tensor_use& u) { return u.op == j; }) != r_.tensors[y].uses.end();
        if (!dev[y] && !used_here) s.evictions.push_back({y, evict_action::drop});
        dev[y] = true;
      }
    for (tensor_id y : t_.ops[j].writes) dev[y] = true;
    for (tensor_id y : t_.ops[j].reads) dev[y] = true;
    std::stable_sort(s.evictions.begin(), s.evictions.end(), [](const eviction& a, const eviction& b) {
      return (a.action == evict_action::drop) > (b.action == evict_action::drop);
    });
    std::stable_sort(s.prefetches.begin(), s.prefetches.end(), [](const prefetch& a, const prefetch& b) { return a.use < b.use; });
  }
  return p;
}

std::optional<optimal_result> builder::run(double time_limit_s, std::string* why, const std::string& solver) {
  auto say = [&](std::string s) -> std::optional<optimal_result> {
    if (why) *why = std::move(s);
    return std::nullopt;
  };
  if (n_ == 0) return say("the trace has no ops");
  if (n_ > optimal_max_ops)
    return say("the trace has " + std::to_string(n_) + " ops, more than the " + std::to_string(optimal_max_ops) +
               " the optimal planner takes");
  if (budget_ < r_.min_budget_bytes) return say("the budget is below the least any plan needs");
  const auto t0 = std::chrono::steady_clock::now();
  choose_fixed();
  make_gaps();
  make_recompute_candidates();
  make_validity();
  make_rows();
  // Starting solutions: the least-memory one and the plans of the library's planners that the
  // program can express (offered to the solver; it keeps the best).
  std::vector<std::vector<double>> starts;
  std::vector<double> start = start_from(nullptr);
  if (!start.empty()) starts.push_back(start);
  for (const auto& name : offload::planner_names()) {
    if (name == "none") continue;
    try {
      const plan other = offload::make_planner(name)->make_plan(t_, r_, hw_, budget_);
      if (other.host_op_count() > 0) continue;  // the program keeps every op on the device
      if (auto v = start_from(&other); !v.empty()) starts.push_back(std::move(v));
    } catch (const std::exception&) {
      // a planner that cannot plan this case offers nothing
    }
  }
  auto objective = [&](const std::vector<double>& v) {
    double o = 0;
    for (int c : T_) o += v[c];
    return o;
  };
  for (const auto& v : starts)
    if (start.empty() || objective(v) < objective(start)) start = v;
  const bool have_start = !start.empty();
  if (!have_start) start.assign(lo_.size() + 1, 0);

  milp m;
  m.lo = lo_;
  m.hi = hi_;
  m.binary = bin_;
  m.objective = T_;
  m.rows.reserve(rows_.size());
  for (const auto& r : rows_) m.rows.push_back({r.e.t, r.lo});
  // The best starting solution first.
  std::stable_sort(starts.begin(), starts.end(),
                   [&](const std::vector<double>& a, const std::vector<double>& b) { return objective(a) < objective(b); });
  m.starts = std::move(starts);
  const double used = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto sol = solve_milp(m, std::max(0.5, time_limit_s - used), solver);

  optimal_result res;
  res.solver = solver.empty() ? milp_solvers().front() : solver;
  res.binaries = static_cast<std::size_t>(std::count(bin_.begin(), bin_.end(), true));
  res.columns = lo_.size();
  res.rows = rows_.size();
  res.status = sol.status;
  res.proven_optimal = sol.proven_optimal;
  std::vector<double> best = start;
  if (sol.found && (!have_start || sol.objective <= objective(start) + 1e-9)) {
    best = sol.x;
    res.objective_s = sol.objective / 1e3;
  } else {
    // The best starting solution stands in where the solver found none better in time (CBC
    // may end on a worse one than the start it was given); the simulator judges its budget.
    res.objective_s = objective(best) / 1e3;
    res.status += ", best starting solution";
  }
  // No bound proven (no LP solution in time): the whole step is the gap.
  res.bound_s = std::isfinite(sol.bound) ? std::min(res.objective_s, sol.bound / 1e3) : 0;
  res.gap = res.proven_optimal ? 0 : (res.objective_s > 0 ? (res.objective_s - res.bound_s) / res.objective_s : 1);
  res.p = make_plan(best);
  res.sim = offload::simulate(t_, r_, res.p, hw_);
  res.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace

std::optional<optimal_result> plan_optimal(const trace& t, const offload::lifetime_report& r, const offload::hw_profile& hw,
                                           std::uint64_t budget, double time_limit_s, std::string* why,
                                           const std::string& solver) {
  require_milp_solver(solver);  // before any work
  return builder(t, r, hw, budget).run(time_limit_s, why, solver);
}

}  // namespace spillway::bench
