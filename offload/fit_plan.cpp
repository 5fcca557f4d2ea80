#include "offload/fit_plan.hpp"

#include <algorithm>

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

fitted_plan fit_plan(const planner& pl, const trace& t, const lifetime_report& r, const hw_profile& hw,
                     const device_budget& budget, int margin_doublings, std::span<const std::int64_t> release_points,
                     std::uint64_t scratch_bytes, int tries) {
  const auto least = r.min_budget_bytes;
  const std::uint64_t budget_bytes = budget.bytes();
  constexpr double near_miss = 1.05;               // within 5% of the budget
  constexpr double refine_miss = 1.10;             // within 10%
  constexpr std::size_t shake_work = 150'000;      // blocks x shaken orders per near miss
  constexpr std::size_t refine_repacks = 1'000;      // packings' worth of refinement per miss within 10%
  // Plans for `b` and packs the plan; it fits when the packing ends within `room`.
  auto attempt = [&](std::uint64_t b, std::uint64_t room) {
    fitted_plan f;
    f.p = pl.make_plan(t, r, hw, b);
    f.margin_doublings = margin_doublings;
    const auto timing = timing_from_simulation(t, r, f.p, hw);
    f.layout = make_layout(t, f.p, release_points, &timing);
    f.predicted_seconds = timing.step;
    // A near miss: shaken orders (Note [Shaken orders]) often pack a few percent tighter, and a
    // refinement of the tightest order (Note [Refined orders]) a few more.
    const auto missed_by = static_cast<double>(f.layout.extent) / static_cast<double>(std::max<std::uint64_t>(1, room));
    if (f.layout.extent > room && missed_by <= refine_miss) {
      layout_search search;
      if (missed_by <= near_miss)
        search.shaken_orders = std::clamp<std::size_t>(shake_work / std::max<std::size_t>(1, f.layout.blocks), 8, 200);
      search.refine_repacks = refine_repacks;
      search.goal = room;
      f.layout = make_layout(t, f.p, release_points, &timing, search);
    }
    f.fits = f.layout.extent <= room;
    return f;
  };
  if (margin_doublings <= device_budget::no_margin) {
    // The whole budget, less the scratch ops take beside the plan (Note [Headroom], 2).
    const std::uint64_t scratch = device_budget::placed(scratch_bytes);
    const std::uint64_t room = budget_bytes > scratch ? budget_bytes - scratch : 0;
    if (room >= least) {
      fitted_plan whole = attempt(room, room);
      if (whole.fits) {
        whole.margin_doublings = device_budget::no_margin;
        return whole;
      }
    }
    margin_doublings = 0;
  }
  auto attempt_within = [&](std::uint64_t b) { return attempt(b, budget_bytes); };
  std::uint64_t hi = budget.planning_bytes(margin_doublings);
  if (hi < least) hi = std::min(budget_bytes, least);
  fitted_plan top = attempt_within(hi);
  if (top.fits || hi <= least || tries <= 0) return top;
  // The packing overshoots the budget: find about the highest planning budget whose packing
  // fits, by bisection between the least any plan needs and the budget that did not fit. A
  // plan's step need not fall as its budget grows, so the fastest plan that fits is kept.
  fitted_plan best = attempt_within(least);
  if (!best.fits) return best;  // nothing fits: the executor places by best fit
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
