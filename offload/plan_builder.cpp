// Plan builder: off-device intervals in, an explicit Plan out. Decides copy versus drop by
// tracking, per tensor, which tier holds a copy of its current value.
#include "offload/plan_builder.hpp"

#include <algorithm>
#include <queue>

namespace spillway::offload::detail {

namespace {
// Note [Prefetches within the budget]
// A planner that brings values back a fixed number of ops ahead of their use (lms's swapin_ahead,
// vdnn's previous layer) holds them through the ops in between whatever those ops need, so at
// a budget near the least any plan needs, the op with the largest working set meets a value
// that is only on its way to a later op, and the plan overshoots (the examples' CNN at 16% of
// its footprint with checkpoint, which falls back to lms there: 25.4 MB held at one op against
// 21.05 MB, and 58 on-demand fetches and evictions a step in the run that followed it). Before
// the plan is built, each op whose resident bytes exceed the budget has the prefetches it holds
// for later ops issued after it instead, those for the farthest use first, until it fits; an op
// that would not fit with all of them delayed keeps them. An op's own reads are never delayed,
// so the pass only lowers bytes, and a plan already within the budget is left as it was. One
// sweep in op order with a heap: n log n.
void delay_prefetches_to_budget(const trace& t, const lifetime_report& r, std::vector<off_interval>& ivs,
                                std::uint64_t budget) {
  const auto res = resident_bytes(t, r, ivs);
  const auto cap = static_cast<std::int64_t>(budget);
  if (res.empty() || *std::max_element(res.begin(), res.end()) <= cap) return;
  const std::size_t n = res.size();
  // The intervals that bring a value back before its use, by the op they are issued at and the
  // op that reads it.
  std::vector<std::vector<std::size_t>> issued_at(n), read_at(n);
  for (std::size_t i = 0; i < ivs.size(); ++i) {
    const auto& iv = ivs[i];
    if (!r.tensors[iv.x].used() || iv.issue >= iv.use || iv.use >= n) continue;
    if (!iv.wraps && iv.issue <= iv.after) continue;  // never off the device: nothing to delay
    issued_at[iv.issue].push_back(i);
    read_at[iv.use].push_back(i);
  }
  auto farther = [&](std::size_t a, std::size_t b) { return ivs[a].use < ivs[b].use; };
  std::priority_queue<std::size_t, std::vector<std::size_t>, decltype(farther)> held(farther);
  std::vector<char> is_held(ivs.size(), 0);
  std::int64_t held_bytes = 0;  // of the values on their way to a later op
  auto bytes_of = [&](std::size_t i) { return static_cast<std::int64_t>(t.tensors[ivs[i].x].bytes); };
  for (std::size_t k = 0; k < n; ++k) {
    for (std::size_t i : issued_at[k]) {
      held.push(i);
      is_held[i] = 1;
      held_bytes += bytes_of(i);
    }
    for (std::size_t i : read_at[k])
      if (is_held[i]) {  // op k reads it: no longer only on its way
        is_held[i] = 0;
        held_bytes -= bytes_of(i);
      }
    // An op over the budget by more than it holds for later ops stays over it: its prefetches
    // keep their places (delaying them would only add waits to a plan that breaks the budget).
    std::int64_t bytes = res[k];
    if (bytes <= cap || bytes - held_bytes > cap) continue;
    while (bytes > cap && !held.empty()) {
      const std::size_t i = held.top();
      held.pop();
      if (!is_held[i]) continue;
      is_held[i] = 0;
      held_bytes -= bytes_of(i);
      bytes -= bytes_of(i);
      ivs[i].issue = static_cast<op_index>(k + 1);
      issued_at[k + 1].push_back(i);  // k + 1 <= use < n
    }
  }
}

bool written_in(const tensor_lifetime& lt, std::int64_t from_excl, std::int64_t to_incl) {
  for (const auto& u : lt.uses)
    if (u.writes && static_cast<std::int64_t>(u.op) > from_excl && static_cast<std::int64_t>(u.op) <= to_incl)
      return true;
  return false;
}
}  // namespace

plan build_plan(const trace& t, const lifetime_report& r, std::vector<off_interval> intervals,
                std::string policy, std::uint64_t budget) {
  plan p = plan::empty_for(t, std::move(policy), budget);
  delay_prefetches_to_budget(t, r, intervals, budget);  // Note [Prefetches within the budget]
  std::sort(intervals.begin(), intervals.end(), [](const off_interval& a, const off_interval& b) {
    if (a.x != b.x) return a.x < b.x;
    if (a.wraps != b.wraps) return !a.wraps;  // the wrap's eviction comes last
    return a.after < b.after;
  });
  std::vector<eviction> copies_after;  // scratch
  for (std::size_t i = 0; i < intervals.size();) {
    const tensor_id x = intervals[i].x;
    std::size_t end = i;
    while (end < intervals.size() && intervals[end].x == x) ++end;
    const auto& lt = r.tensors[x];
    // Which tier holds the current value, and since when (op index; -1 = start).
    bool have_copy = false;
    tier copy_tier = tier::host;
    std::int64_t copy_at = -1;
    if (intervals[end - 1].wraps) {
      p.initial_tier[x] = intervals[end - 1].where;
      if (lt.crosses_boundary) {
        have_copy = true;
        copy_tier = intervals[end - 1].where;
      }
    }
    for (std::size_t k = i; k < end; ++k) {
      const auto& iv = intervals[k];
      if (!lt.used()) break;  // never touched: off all iteration, nothing to do
      const bool needed = iv.wraps ? lt.crosses_boundary : [&] {
        for (const auto& u : lt.uses)
          if (u.op == iv.use) return u.reads;
        return false;
      }();
      evict_action action = evict_action::drop;
      if (needed) {
        const bool clean = have_copy && copy_tier == iv.where && !written_in(lt, copy_at, iv.after);
        if (!clean) {
          action = iv.where == tier::host ? evict_action::evict_to_host : evict_action::evict_to_nvme;
          have_copy = true;
          copy_tier = iv.where;
          copy_at = iv.after;
        }
        p.steps[iv.issue].prefetches.push_back({x, iv.where, iv.use});
      }
      p.steps[iv.after].evictions.push_back({x, action});
    }
    i = end;
  }
  for (tensor_id x = 0; x < t.tensors.size(); ++x)
    if (!is_persistent(t.tensors[x].kind) && r.tensors[x].used())
      p.steps[r.tensors[x].last_use()].evictions.push_back({x, evict_action::drop});
  for (auto& s : p.steps) {
    std::stable_sort(s.evictions.begin(), s.evictions.end(), [](const eviction& a, const eviction& b) {
      return (a.action == evict_action::drop) > (b.action == evict_action::drop);
    });
    std::stable_sort(s.prefetches.begin(), s.prefetches.end(),
                     [](const prefetch& a, const prefetch& b) { return a.use < b.use; });
  }
  return p;
}

std::vector<std::int64_t> resident_bytes(const trace& t, const lifetime_report& r,
                                         const std::vector<off_interval>& intervals) {
  const std::size_t n = t.ops.size();
  std::vector<std::int64_t> diff(n + 1, 0);
  auto add = [&](std::size_t from, std::size_t to, std::int64_t b) {
    if (from > to || from >= n) return;
    diff[from] += b;
    diff[std::min(to, n - 1) + 1] -= b;
  };
  for (std::size_t j = 0; j < n; ++j) {
    diff[j] += static_cast<std::int64_t>(r.live_bytes_during[j]);
    diff[j + 1] -= static_cast<std::int64_t>(r.live_bytes_during[j]);
  }
  for (const auto& iv : intervals) {
    const auto b = static_cast<std::int64_t>(t.tensors[iv.x].bytes);
    if (!r.tensors[iv.x].used()) {
      if (n > 0) add(0, n - 1, -b);
    } else if (iv.wraps) {
      if (iv.after + 1 <= n - 1) add(iv.after + 1, n - 1, -b);
      if (iv.issue > 0) add(0, iv.issue - 1, -b);
    } else if (iv.issue > iv.after + 1) {
      add(iv.after + 1, iv.issue - 1, -b);
    }
  }
  std::vector<std::int64_t> out(n);
  std::int64_t acc = 0;
  for (std::size_t j = 0; j < n; ++j) out[j] = acc += diff[j];
  return out;
}

}  // namespace spillway::offload::detail
