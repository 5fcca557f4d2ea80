#include "offload/fit_plan.hpp"

#include <algorithm>
#include <optional>

#include "offload/simulator.hpp"

namespace spillway::offload {
namespace {

// The op of `ops` (ascending) whose boundary time, boundary(k), is the latest not after `at`:
// the move that a copy starting at `at` belongs to.
template <class Boundary>
std::optional<op_index> latest_issue(const std::vector<op_index>& ops, double at, Boundary boundary) {
  auto it = std::upper_bound(ops.begin(), ops.end(), at, [&](double s, op_index k) { return s < boundary(k) - 1e-12; });
  if (it == ops.begin()) return std::nullopt;
  return *std::prev(it);
}

}  // namespace

plan_timing timing_from_simulation(const trace& t, const lifetime_report& r, const plan& p, const hw_profile& hw) {
  sim_options so;
  so.record_timeline = true;
  const auto sim = simulate(t, r, p, hw, so);
  const std::size_t n = t.ops.size();
  plan_timing out;
  out.op_start.assign(n, 0);
  out.op_end.assign(n, 0);
  out.step = sim.step_seconds;
  for (const auto& e : sim.timeline) {
    // A device op's run, or a host op's (Note [Host ops]): when it starts and ends.
    if ((e.track != sim_track::compute && e.track != sim_track::host) || e.id >= n) continue;
    out.op_start[e.id] = e.start;
    out.op_end[e.id] = e.end;
  }
  // Prefetches are issued at the boundary before their op (when the op before it ends),
  // evictions at the end of their op; each copy belongs to the latest such move of its tensor.
  std::vector<std::vector<op_index>> prefetched_before(t.tensors.size()), evicted_after(t.tensors.size());
  for (op_index k = 0; k < p.steps.size() && k < n; ++k) {
    for (const auto& f : p.steps[k].prefetches)
      if (f.tensor < t.tensors.size()) prefetched_before[f.tensor].push_back(k);
    for (const auto& e : p.steps[k].evictions)
      if (e.action != evict_action::drop && e.tensor < t.tensors.size()) evicted_after[e.tensor].push_back(k);
  }
  auto boundary_before = [&](op_index k) { return k == 0 ? 0.0 : out.op_end[k - 1]; };
  auto end_of = [&](op_index k) { return out.op_end[k]; };
  for (const auto& e : sim.timeline) {
    if (e.id >= t.tensors.size()) continue;
    if (e.track == sim_track::h2d) {
      if (auto k = latest_issue(prefetched_before[e.id], e.start, boundary_before))
        out.load_start.emplace(plan_timing::key(e.id, *k), e.start);
    } else if (e.track == sim_track::d2h) {
      if (auto k = latest_issue(evicted_after[e.id], e.start, end_of)) out.save_end[plan_timing::key(e.id, *k)] = e.end;
    }
  }
  return out;
}

// Note [Untimed layouts]
// A layout kept apart in device time (plan_timing) gives no bytes to a copy in or an op while a
// copy out still holds them, so the plan runs as the simulator timed it. Near the least budget no
// such packing may fit (ResNet-50 at 1/8 of its peak on h200: auto's plans for 0.85 to 1.0 of the
// 689 MiB budget pack in 709 to 845 MiB with device time), and the executor then places by best fit
// and evicts on demand. Packed in the executor's order alone, a plan may fit (the one made for the
// least budget, 588 MiB, in 663 MiB): where a block lies over bytes a copy out still holds, the
// copy in or the op waits for it, since the arena hands bytes from one stream to another only after
// the first is done with them (Note [Arena handoff] in allocator/arena_allocator.hpp). So where no
// plan the search tried packs with device time, fit_plan packs those plans in order alone and keeps
// the fastest that fits, timed with a replay that makes every allocation wait for its bytes (Note
// [Addresses in the replay] in simulator.cpp). Where none of them made above the least budget so
// fits, it also plans down from the top on a grid of twice `tries` budgets toward the least, until
// a plan made for at least the grid's budget fits (in order alone, or with device time): a plan's
// packing does not shrink steadily with its budget (on that row, of plans made every 2 MiB from 620
// to 666 MiB, 10 pack in order alone within 689 MiB and 14 do not, in no order), so no bisection
// can follow it, and the higher the budget the faster the plan, mostly. On that row the least
// budget's plan takes 131.8 ms with its waits; the grid's fourth plan, made for 643.0 MiB, packs in
// 668.1 MiB and takes 74.4 ms with them (fit_plan takes 29.0 s on two cores). Only
// where nothing packs with device time: where a plan does, the plans packed in order alone wait too
// long to win (ResNet-152 at 1/8: the whole budget's plan, 42.7 ms as timed, takes 58.4 ms packed
// in order alone, where the plan kept with device time takes 45.8), and packing them costs time (a
// 7,812-op GPT-2 trace at 1/4: 1.1 s a plan, 3.5 s with the search of a near miss).

// Note [Above the margin]
// A Session's first plan is made for the whole budget less the ops' scratch, and kept where its
// packing ends within that room (Note [Headroom], 2, in allocator/device_budget.hpp); where it
// does not, the plan for the budget less the packing margin (1/32) often packs with room to spare
// while a plan for a budget between the two would pack too, and run faster. So where the margin's
// plan fits, fit_plan bisects between it and the whole budget's, three plans at most, each
// packed within the whole budget's room (it leaves the scratch its place as that plan would), and
// keeps the fastest that fits, made with no margin (device_budget::no_margin: a plan that then
// evicts on demand is made again at the margin). On h200, GPT-3 13B at 1/4 of its peak: the
// margin's plan 1,290.0 ms; a plan made for 0.988 of the budget packs in 75,449 MiB of 75,494 and
// takes 1,268.7 ms (the row, planned for the whole budget, 1,263.5).

fitted_plan fit_plan(const planner& pl, const trace& t, const lifetime_report& r, const hw_profile& hw,
                     const device_budget& budget, int margin_doublings, std::span<const std::int64_t> release_points,
                     std::uint64_t scratch_bytes, int tries) {
  const auto least = r.min_budget_bytes;
  const std::uint64_t budget_bytes = budget.bytes();
  constexpr double near_miss = 1.05;               // within 5% of the budget
  constexpr double refine_miss = 1.10;             // within 10%
  constexpr std::size_t shake_work = 150'000;      // blocks x shaken orders per near miss
  constexpr std::size_t refine_repacks = 1'000;      // packings' worth of refinement per miss within 10%
  constexpr int above_margin_tries = 3;               // plans between the margin and the whole budget
  // Packs p, with device time where `timing` is given; a near miss is packed again harder:
  // shaken orders (Note [Shaken orders]) often pack a few percent tighter, and a refinement of
  // the tightest order (Note [Refined orders]) a few more.
  auto pack = [&](const plan& p, const plan_timing* timing, std::uint64_t room) {
    auto layout = make_layout(t, p, release_points, timing);
    const auto missed_by = static_cast<double>(layout.extent) / static_cast<double>(std::max<std::uint64_t>(1, room));
    if (layout.extent > room && missed_by <= refine_miss) {
      layout_search search;
      if (missed_by <= near_miss)
        search.shaken_orders = std::clamp<std::size_t>(shake_work / std::max<std::size_t>(1, layout.blocks), 8, 200);
      search.refine_repacks = refine_repacks;
      search.goal = room;
      layout = make_layout(t, p, release_points, timing, search);
    }
    return layout;
  };
  // Plans for `b` and packs the plan with device time; it fits when the packing ends within
  // `room`. A plan that does not fit is kept for the packing in order alone, should none fit.
  struct miss {
    plan p;
    std::uint64_t room;
    int margin_doublings;
  };
  std::vector<miss> missed;
  auto attempt = [&](std::uint64_t b, std::uint64_t room) {
    fitted_plan f;
    f.p = pl.make_plan(t, r, hw, b);
    f.margin_doublings = margin_doublings;
    const auto timing = timing_from_simulation(t, r, f.p, hw);
    f.layout = pack(f.p, &timing, room);
    f.predicted_seconds = timing.step;
    f.fits = f.layout.extent <= room;
    if (!f.fits) missed.push_back({f.p, room, margin_doublings});
    return f;
  };
  // Where `m`'s packing in the executor's order alone fits its room: that plan, timed with the
  // waits for its addresses (Note [Untimed layouts]).
  auto in_order = [&](miss m) -> std::optional<fitted_plan> {
    auto untimed = pack(m.p, nullptr, m.room);
    if (untimed.extent > m.room) return std::nullopt;
    sim_options so;
    so.layout = &untimed;
    const auto replay = simulate(t, r, m.p, hw, so);
    if (!replay.feasible()) return std::nullopt;
    return fitted_plan{.p = std::move(m.p),
                       .layout = std::move(untimed),
                       .fits = true,
                       .waits_for_addresses = true,
                       .predicted_seconds = replay.step_seconds,
                       .margin_doublings = m.margin_doublings};
  };
  // `f` where it fits; else the fastest plan whose packing in order alone fits, of the plans
  // tried and, with `grid` steps, of plans made down from `top` toward the least budget on a grid
  // of `grid` budgets, until one made for at least the grid's budget fits (Note [Untimed
  // layouts]); else `f`.
  auto or_in_order = [&](fitted_plan f, std::uint64_t top, int grid) {
    if (f.fits) return f;
    std::optional<fitted_plan> fastest;
    std::uint64_t highest = 0;  // the highest planning budget whose plan fits
    auto keep = [&](fitted_plan g) {
      highest = std::max(highest, g.p.budget_bytes);
      if (!fastest || g.predicted_seconds < fastest->predicted_seconds) fastest = std::move(g);
    };
    for (auto& m : missed)
      if (auto g = in_order(std::move(m))) keep(std::move(*g));
    missed.clear();
    for (int i = 1; i <= grid; ++i) {
      const std::uint64_t b = top - (top - least) * static_cast<std::uint64_t>(i) / static_cast<std::uint64_t>(grid + 1);
      if (b <= least || highest >= b) break;
      fitted_plan g = attempt(b, budget_bytes);
      if (g.fits) {  // with device time: no waits
        keep(std::move(g));
        break;
      }
      auto h = in_order(std::move(missed.back()));
      missed.pop_back();
      if (h) keep(std::move(*h));
    }
    return fastest ? std::move(*fastest) : f;
  };
  std::uint64_t whole_room = 0;  // where the whole budget's plan did not fit: its room
  if (margin_doublings <= device_budget::no_margin) {
    // The whole budget, less the scratch ops take beside the plan (Note [Headroom], 2).
    const std::uint64_t scratch = device_budget::placed(scratch_bytes);
    const std::uint64_t room = budget_bytes > scratch ? budget_bytes - scratch : 0;
    if (room >= least) {
      margin_doublings = device_budget::no_margin;
      fitted_plan whole = attempt(room, room);
      if (whole.fits) return whole;
      whole_room = room;
    }
    margin_doublings = 0;
  }
  auto attempt_within = [&](std::uint64_t b) { return attempt(b, budget_bytes); };
  std::uint64_t hi = budget.planning_bytes(margin_doublings);
  if (hi < least) hi = std::min(budget_bytes, least);
  fitted_plan top = attempt_within(hi);
  if (top.fits && whole_room > hi) {
    // Between the margin and the whole budget (Note [Above the margin]): bisection, each plan
    // packed within the whole budget's room, the fastest that fits kept.
    std::uint64_t lo = hi, up = whole_room;
    for (int i = 0; i < above_margin_tries && up - lo > budget_bytes / 256; ++i) {
      const std::uint64_t mid = lo + (up - lo) / 2;
      fitted_plan f = attempt(mid, whole_room);
      if (!f.fits) {
        up = mid;
        continue;
      }
      lo = mid;
      f.margin_doublings = device_budget::no_margin;
      if (f.predicted_seconds <= top.predicted_seconds) top = std::move(f);
    }
    return top;
  }
  if (top.fits || hi <= least || tries <= 0) return or_in_order(std::move(top), hi, 0);
  // The packing overshoots the budget: find about the highest planning budget whose packing
  // fits, by bisection between the least any plan needs and the budget that did not fit. A
  // plan's step need not fall as its budget grows, so the fastest plan that fits is kept.
  fitted_plan best = attempt_within(least);
  // Nothing packs with device time: the fastest plan packed in order alone, searched down from
  // the top, else the executor places by best fit.
  if (!best.fits) return or_in_order(std::move(best), hi, 2 * tries);
  std::uint64_t lo = least;
  for (int i = 1; i < tries && hi - lo > budget_bytes / 256; ++i) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    fitted_plan f = attempt_within(mid);
    if (f.fits) {
      lo = mid;
      if (f.predicted_seconds <= best.predicted_seconds) best = std::move(f);
    } else {
      hi = mid;
    }
  }
  return best;
}

}  // namespace spillway::offload
