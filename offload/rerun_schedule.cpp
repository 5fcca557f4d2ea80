// Rerun schedules (Note [Rerun schedules]): from a set of values to drop and make again, the
// reruns each op needs before it, and the trace with those reruns folded in.
#include "offload/rerun_schedule.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "device/error.hpp"
#include "prefetch/recompute.hpp"

namespace spillway::offload::detail {

// Note [Rerun schedules]
// A planner that recomputes first picks values to drop (candidates: transients one
// recomputable op wrote, read again after an idle stretch; one of less than four times the
// op's own duration only where the op's inputs are still there at its end: a short stretch
// frees the bytes too briefly to pay for a chain; ResNet-152 at 1/8 of its peak on h200:
// 101.0 -> 66.1 ms), then the schedule places the
// reruns: in op order of the reads that end the stretches, the writer of each value is rerun
// before that read, after the writers of any of its inputs that are gone by then (dropped and
// not yet made again, or dead after their last use): a chain back to values that are still
// there. A rerun writes every output of its op, so a dropped value that a rerun makes early
// is there from then on (its own rerun is not needed); or, where memory is short (keep_made
// false, or for the values of `again` alone), it is dropped again after the op and made once
// more before its own read: more reruns, fewer bytes held. A value whose writer's inputs were
// overwritten since the writer ran cannot be made with the same bits: it is kept.
// Spread chains: a chain before op k holds every value it makes until op k has run, so a long
// one needs the memory of all its values at once. Spread, each rerun of the chain moves back
// from op k by its distance from the end of the list (the last stays before op k, the one
// before it goes before op k-1, ...), never before its op has run plus one, before what it
// makes is gone (dropped, or dead after its last use), or before an input dropped and made
// again is back, and never ahead of an earlier entry:
// each value is made one op before the rerun that reads it, and dropped after that rerun (a
// released one the executor keeps until then: Note [Rerun temps across steps] in
// prefetch/recompute.hpp), so only two links of the chain are held at a time. Given the
// budget, a rerun also skips, toward op k, any op that would hold more than the budget with it
// (the op's own tensors, the reruns spread to it so far and this rerun's, each counted whole):
// moved back blindly, a rerun of resnet50's first block went beside the backward op of its
// shortcut's batch norm, 709 MiB on h200 against a budget of 689 (1/8 of the peak), and no swap
// plan could keep it (auto on that row: 63.9 -> 61.3 ms). With room_for_held, the op's room
// also counts the values held over it that no rerun can make (a gradient written before the op
// and read after it, a value several ops write): a rerun beside it would push them off the
// device, a copy out and back on the link where the rerun was to spare one (ResNet-50 at 1/8
// keeps the 189 MiB gradient layer1.2.relu3.bwd writes from there to layer1.2.conv1.bwd, eight
// ops later). auto weighs schedules with and without it (Note [Recomputing planners]).
// The swap planners then see the folded trace: each op with reruns also writes what they write
// (so a dropped value is, to them, dead from its drop to its rerun: dropping it needs no copy),
// reads what they read (so weights a rerun needs are brought back for it, and the memory of the
// chain's values is counted while the op runs: the executor frees them after the op), and
// lasts as long as the reruns and the op together. Their plan, with the reruns added to its
// steps, is a plan for the real trace; the simulator, on the real trace, is the judge.

namespace {
constexpr op_index none = std::numeric_limits<op_index>::max();
// origin of the folded trace's scratch for the temps freed before an op: no tensor of the trace.
constexpr tensor_id no_origin = std::numeric_limits<tensor_id>::max();
// A candidate's stretch holds at least this many times its writer's duration in compute
// (remake_candidates).
constexpr double least_stretch_per_rerun = 4.0;

// The op that writes transient x, when exactly one op does and it is recomputable.
std::vector<op_index> single_recomputable_writer(const trace& t, const lifetime_report& r) {
  std::vector<op_index> w(t.tensors.size(), none);
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    if (is_persistent(t.tensors[x].kind)) continue;
    op_index only = none;
    int writes = 0;
    for (const auto& u : r.tensors[x].uses)
      if (u.writes) {
        ++writes;
        only = u.op;
      }
    if (writes == 1 && t.ops[only].recomputable) w[x] = only;
  }
  return w;
}

class scheduler {
 public:
  scheduler(const trace& t, const lifetime_report& r, const hw_profile& hw)
      : t_(t), r_(r), hw_(hw), writer_(single_recomputable_writer(t, r)) {}

  rerun_schedule run(const std::vector<remake_candidate>& cands, const std::vector<char>& want, bool keep_made,
                     bool spread, const std::vector<char>& again, std::uint64_t budget, bool room_for_held) {
    const std::size_t nt = t_.tensors.size(), n = t_.ops.size();
    budget_ = budget;
    spread_bytes_.assign(n, 0);
    held_over_ = room_for_held && budget != std::numeric_limits<std::uint64_t>::max() ? held_over()
                                                                                       : std::vector<std::uint64_t>(n, 0);
    scheduled_.assign(nt, 0);
    drop_after_.assign(nt, -1);
    remake_at_.assign(nt, -1);
    made_now_.assign(nt, 0);
    std::vector<std::pair<op_index, tensor_id>> events;
    for (const auto& c : cands) {
      if (c.x >= want.size() || !want[c.x] || writer_[c.x] == none) continue;
      scheduled_[c.x] = 1;
      drop_after_[c.x] = c.after;
      remake_at_[c.x] = c.use;
      events.push_back({c.use, c.x});
    }
    std::sort(events.begin(), events.end());
    rerun_schedule s;
    s.reruns.assign(n, {});
    for (std::size_t i = 0; i < events.size();) {
      const op_index k = events[i].first;
      auto& list = s.reruns[k];
      for (; i < events.size() && events[i].first == k; ++i) {
        const tensor_id x = events[i].second;
        if (!scheduled_[x] || remake_at_[x] != k || made_now_[x]) continue;
        const auto mark = list.size();
        if (!remake(x, k, list)) {
          for (auto j = mark; j < list.size(); ++j)
            for (tensor_id z : t_.ops[list[j]].writes) made_now_[z] = 0;
          list.resize(mark);
          scheduled_[x] = 0;  // kept on the device (or swapped) instead
        }
      }
      for (op_index o : list)
        for (tensor_id z : t_.ops[o].writes) {
          made_now_[z] = 0;
          const bool keep = keep_made && (z >= again.size() || !again[z]);
          if (keep && scheduled_[z] && drop_after_[z] < k && k <= remake_at_[z]) remake_at_[z] = k;  // there from now on
        }
      if (spread && list.size() > 1) spread_chain(k, s.reruns);
    }
    for (tensor_id x = 0; x < nt; ++x) s.remade += scheduled_[x];
    s.folded = fold(s.reruns, s.origin);
    return s;
  }

 private:
  bool off_at(tensor_id y, op_index k) const {
    if (is_persistent(t_.tensors[y].kind) || made_now_[y]) return false;
    if (scheduled_[y] && drop_after_[y] < static_cast<std::int64_t>(k) && static_cast<std::int64_t>(k) <= remake_at_[y])
      return true;
    return r_.tensors[y].last_use() < k;  // gone after its last use
  }
  bool written_between(tensor_id y, op_index from, op_index to) const {
    for (const auto& u : r_.tensors[y].uses)
      if (u.op > from && u.op < to && u.writes) return true;
    return false;
  }
  // Appends to `list` the reruns that make x before op k; false when it cannot be made.
  bool remake(tensor_id x, op_index k, std::vector<op_index>& list) {
    const op_index o = writer_[x];
    if (o == none || o >= k) return false;
    if (std::find(list.begin(), list.end(), o) != list.end()) return true;
    for (tensor_id y : t_.ops[o].reads) {
      if (written_between(y, o, k)) return false;
      if (off_at(y, k) && !remake(y, k, list)) return false;
    }
    list.push_back(o);
    for (tensor_id z : t_.ops[o].writes) made_now_[z] = 1;
    return true;
  }

  // Moves the reruns before op k back by their distance from the end of the list, one op each,
  // where their op has run and what they make is gone by then (Note [Rerun schedules], spread
  // chains); the order of the list is kept across the steps.
  void spread_chain(op_index k, std::vector<std::vector<op_index>>& reruns) {
    auto& list = reruns[k];
    const std::size_t m = list.size();
    const auto kk = static_cast<std::int64_t>(k);
    // The entry of the list that makes each value (producer_), and depth: how many entries, one
    // after another, read what an entry makes (0 for those only op k reads). Several chains may
    // share the list; each spreads by its own.
    producer_.resize(t_.tensors.size(), -1);
    for (std::size_t e = 0; e < m; ++e)
      for (tensor_id z : t_.ops[list[e]].writes)
        if (producer_[z] < 0) producer_[z] = static_cast<std::int64_t>(e);
    std::vector<std::int64_t> depth(m, 0), step(m, 0);
    for (std::size_t f = m; f-- > 0;)
      for (tensor_id y : t_.ops[list[f]].reads)
        if (producer_[y] >= 0 && static_cast<std::size_t>(producer_[y]) < f)
          depth[static_cast<std::size_t>(producer_[y])] = std::max(depth[static_cast<std::size_t>(producer_[y])], depth[f] + 1);
    std::vector<op_index> stay;
    for (std::size_t e = 0; e < m; ++e) {
      const op_index o = list[e];
      std::int64_t at = std::max(static_cast<std::int64_t>(o) + 1, kk - depth[e]);
      for (tensor_id z : t_.ops[o].writes)
        at = std::max(at, scheduled_[z] ? drop_after_[z] + 1 : static_cast<std::int64_t>(r_.tensors[z].last_use()) + 1);
      for (tensor_id y : t_.ops[o].reads) {
        const auto f = producer_[y];
        if (f >= 0 && static_cast<std::size_t>(f) < e) {
          at = std::max(at, step[static_cast<std::size_t>(f)]);  // after what it reads
        } else if (scheduled_[y] && drop_after_[y] < kk && remake_at_[y] < kk) {
          // An input the list does not make that was dropped is there again only from the
          // step that made it before op k.
          at = std::max(at, remake_at_[y]);
        }
      }
      at = std::min(at, kk);
      // Never after a rerun of that step that reads what this one makes (its list runs in order),
      // nor where the op of that step would hold more than the budget with it.
      while (at < kk && (reads_output_of(reruns[static_cast<std::size_t>(at)], o) || !room_at(static_cast<op_index>(at), o)))
        ++at;
      if (at < kk) spread_bytes_[static_cast<std::size_t>(at)] += rerun_bytes(o);
      step[e] = at;
      if (at == kk) {
        stay.push_back(o);
      } else {
        auto& to = reruns[static_cast<std::size_t>(at)];
        if (std::find(to.begin(), to.end(), o) == to.end()) to.push_back(o);
      }
    }
    for (op_index o : list)
      for (tensor_id z : t_.ops[o].writes) producer_[z] = -1;
    list = std::move(stay);
  }
  // The bytes a rerun of op o touches: what it reads and what it writes.
  std::uint64_t rerun_bytes(op_index o) const {
    std::uint64_t b = 0;
    for (tensor_id y : t_.ops[o].reads) b += t_.tensors[y].bytes;
    for (tensor_id z : t_.ops[o].writes) b += t_.tensors[z].bytes;
    return b;
  }
  // Whether op k, with the values held over it, the reruns spread to it so far and a rerun of
  // o, stays within the budget (counting each rerun's tensors in full: an upper bound on what
  // the folded op holds).
  bool room_at(op_index k, op_index o) const {
    return t_.working_set_bytes(k) + held_over_[k] + spread_bytes_[k] + rerun_bytes(o) <= budget_;
  }
  // Per op, the bytes of the transients no rerun can make (a gradient, a value several ops
  // write) written before the op and read after it, that it does not touch (Note [Rerun
  // schedules], spread chains): a rerun beside the op would push them off the device.
  std::vector<std::uint64_t> held_over() const {
    const std::size_t n = t_.ops.size();
    std::vector<std::int64_t> diff(n + 1, 0);
    for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
      if (is_persistent(t_.tensors[x].kind) || writer_[x] != none) continue;
      const auto& u = r_.tensors[x].uses;
      const auto bytes = static_cast<std::int64_t>(t_.tensors[x].bytes);
      for (std::size_t i = 0; i + 1 < u.size(); ++i)
        if (u[i + 1].reads && u[i + 1].op > u[i].op + 1) {
          diff[u[i].op + 1] += bytes;
          diff[u[i + 1].op] -= bytes;
        }
    }
    std::vector<std::uint64_t> out(n, 0);
    std::int64_t run = 0;
    for (std::size_t k = 0; k < n; ++k) out[k] = static_cast<std::uint64_t>(run += diff[k]);
    return out;
  }
  bool reads_output_of(const std::vector<op_index>& entries, op_index o) const {
    for (op_index e : entries)
      for (tensor_id y : t_.ops[e].reads)
        for (tensor_id z : t_.ops[o].writes)
          if (y == z) return true;
    return false;
  }

  // The folded trace (Note [Rerun schedules]); each value a rerun makes is a new tensor there
  // (origin maps it back), so that the value dropped and the value made again have lifetimes of
  // their own.
  trace fold(const std::vector<std::vector<op_index>>& reruns, std::vector<tensor_id>& origin) const {
    trace f = t_;
    // Which values reruns make only for the reruns after them in the same list (Note [Rerun
    // temps before the op]): the executor frees them before the op's own tensors are placed.
    plan steps;
    steps.steps.resize(t_.ops.size());
    for (op_index k = 0; k < t_.ops.size(); ++k) steps.steps[k].recomputes = reruns[k];
    const rerun_index index(t_, steps);
    const auto& lt = r_.tensors;
    // Its reruns are the schedule's: a planner of the folded trace places copies, and reruns
    // none of its own (unfold_plan keeps the schedule's alone), even one that could.
    for (auto& op : f.ops) op.recomputable = false;
    const std::size_t nt = t_.tensors.size();
    origin.resize(nt);
    for (tensor_id x = 0; x < nt; ++x) origin[x] = x;
    std::vector<tensor_id> alias(nt);
    for (tensor_id x = 0; x < nt; ++x) alias[x] = x;
    std::vector<char> made(nt, 0), in;
    for (op_index k = 0; k < t_.ops.size(); ++k) {
      auto& op = f.ops[k];
      if (reruns[k].empty()) {
        for (auto& y : op.reads) y = alias[y];
        for (auto& y : op.writes) y = alias[y];
        continue;
      }
      double seconds = hw_.op_seconds(t_.ops[k]);
      std::vector<tensor_id> reads, writes;
      in.assign(f.tensors.size() + 64, 0);
      auto add = [&](std::vector<tensor_id>& v, tensor_id y) {
        if (y >= in.size()) in.resize(y + 64, 0);
        if (in[y]) return;
        in[y] = 1;
        v.push_back(y);
      };
      for (op_index o : reruns[k]) {
        seconds += hw_.op_seconds(t_.ops[o]);
        for (tensor_id z : t_.ops[o].writes) made[z] = 1;
      }
      // Inputs: what the reruns and the op read that no rerun makes, under their current names.
      for (op_index o : reruns[k])
        for (tensor_id y : t_.ops[o].reads)
          if (!made[y]) add(reads, alias[y]);
      for (tensor_id y : t_.ops[k].reads)
        if (!made[y]) add(reads, alias[y]);
      // What the reruns make: new names from here on. The temps freed before the op are not
      // tensors of the folded op: they and the op's fresh outputs (first written by it) take
      // the same bytes one after the other, so the op holds only the larger of the two, as a
      // scratch value of the difference beside its outputs.
      std::uint64_t temps = 0, fresh_out = 0;
      for (op_index o : reruns[k])
        for (tensor_id z : t_.ops[o].writes) {
          if (made[z] == 2 || made[z] == 3) continue;  // named (or counted) already at this op
          if (index.freed_before_op(z, k)) {
            temps += t_.tensors[z].bytes;
            made[z] = 3;
            continue;
          }
          if (alias[z] != z && origin[alias[z]] == z && made[z] == 2) continue;
          const auto fresh = f.add_tensor(t_.tensors[z].name + "@" + std::to_string(k), t_.tensors[z].bytes, t_.tensors[z].kind);
          origin.push_back(z);
          alias[z] = fresh;
          made[z] = 2;
          add(writes, fresh);
        }
      for (tensor_id w : t_.ops[k].writes) {
        add(writes, alias[w]);
        const auto& u = lt[w].uses;
        if (!is_persistent(t_.tensors[w].kind) && !made[w] && !u.empty() && u.front().op == k && !u.front().reads)
          fresh_out += t_.tensors[w].bytes;
      }
      if (temps > fresh_out) {
        const auto scratch = f.add_tensor(t_.ops[k].name + ".rerun_temps", temps - fresh_out, tensor_kind::workspace);
        origin.push_back(no_origin);
        add(writes, scratch);
      }
      for (op_index o : reruns[k])
        for (tensor_id z : t_.ops[o].writes) made[z] = 0;
      op.reads = std::move(reads);
      op.writes = std::move(writes);
      op.measured_seconds = seconds;
    }
    return f;
  }

  const trace& t_;
  const lifetime_report& r_;
  const hw_profile& hw_;
  std::vector<op_index> writer_;
  std::vector<char> scheduled_, made_now_;
  std::vector<std::int64_t> drop_after_, remake_at_;
  std::vector<std::int64_t> producer_;  // spread_chain's scratch: per tensor, the list entry that makes it
  std::uint64_t budget_ = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint64_t> spread_bytes_;  // per op: bytes of the reruns spread to it
  std::vector<std::uint64_t> held_over_;     // per op: held_over()
};

}  // namespace

std::vector<remake_candidate> remake_candidates(const trace& t, const lifetime_report& r, const hw_profile& hw) {
  const auto writer = single_recomputable_writer(t, r);
  std::vector<double> at(t.ops.size() + 1, 0);
  for (std::size_t k = 0; k < t.ops.size(); ++k) at[k + 1] = at[k] + hw.op_seconds(t.ops[k]);
  std::vector<remake_candidate> out;
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    if (writer[x] == none || !may_leave_device(t.tensors[x].kind)) continue;
    remake_candidate best{};
    bool found = false;
    for (const auto& g : r.tensors[x].gaps) {
      if (g.wraps || !g.contents_needed || g.after < writer[x]) continue;
      const double secs = at[g.before] - at[g.after + 1];
      if (!found || secs > best.gap_seconds) {
        best = {x, writer[x], g.after, g.before, secs, hw.op_seconds(t.ops[writer[x]])};
        found = true;
      }
    }
    if (found) out.push_back(best);
  }
  // A stretch shorter than a few reruns of the writer (a value read again a few ops later in the
  // forward pass: a block's branch output waiting for its shortcut) frees its bytes too briefly
  // to pay for a chain: such a candidate stays only where the writer's inputs are still there
  // when it is made again (persistent, not dropped over that op themselves, not dead by then).
  std::vector<const remake_candidate*> of(t.tensors.size(), nullptr);
  for (const auto& c : out) of[c.x] = &c;
  auto there = [&](tensor_id y, op_index use) {
    if (is_persistent(t.tensors[y].kind)) return true;
    if (of[y] && of[y]->after < use && use <= of[y]->use) return false;
    return r.tensors[y].used() && r.tensors[y].last_use() >= use;
  };
  std::vector<remake_candidate> kept;
  for (const auto& c : out) {
    const auto& reads = t.ops[c.writer].reads;
    if (c.gap_seconds >= least_stretch_per_rerun * c.rerun_seconds ||
        std::all_of(reads.begin(), reads.end(), [&](tensor_id y) { return there(y, c.use); }))
      kept.push_back(c);
  }
  return kept;
}

rerun_schedule schedule_reruns(const trace& t, const lifetime_report& r, const hw_profile& hw,
                               const std::vector<remake_candidate>& candidates, const std::vector<char>& want,
                               bool keep_made, bool spread, const std::vector<char>& again, std::uint64_t budget,
                               bool room_for_held) {
  return scheduler(t, r, hw).run(candidates, want, keep_made, spread, again, budget, room_for_held);
}

plan unfold_plan(plan folded, const rerun_schedule& s, std::size_t tensors) {
  folded.initial_tier.resize(tensors);
  for (std::size_t k = 0; k < folded.steps.size(); ++k) {
    auto& st = folded.steps[k];
    if (!st.recomputes.empty())
      throw usage_error("unfold_plan: the plan reruns op " + std::to_string(st.recomputes.front()) + " before op " +
                        std::to_string(k) + " of the folded trace, whose ops may not be rerun; plan it with a swap planner");
    // The scratch of the temps freed before an op is none of the trace's tensors.
    std::erase_if(st.evictions, [&](const eviction& e) { return s.origin[e.tensor] == no_origin; });
    std::erase_if(st.prefetches, [&](const prefetch& pf) { return s.origin[pf.tensor] == no_origin; });
    for (auto& e : st.evictions) e.tensor = s.origin[e.tensor];
    for (auto& pf : st.prefetches) pf.tensor = s.origin[pf.tensor];
    if (k < s.reruns.size()) st.recomputes = s.reruns[k];
  }
  return folded;
}

}  // namespace spillway::offload::detail
