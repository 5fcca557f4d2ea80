#include "offload/fit_plan.hpp"

#include <algorithm>

#include "offload/simulator.hpp"

namespace spillway::offload {

std::vector<std::vector<late_free>> late_frees_from_simulation(const trace& t, const plan& p, const hw_profile& hw) {
  sim_options so;
  so.record_timeline = true;
  const auto sim = simulate(t, p, hw, so);
  const std::size_t n = t.ops.size();
  std::vector<double> op_start(n, 0), op_end(n, 0);
  for (const auto& e : sim.timeline) {
    if (e.track != sim_track::compute || e.id >= n) continue;
    op_start[e.id] = e.start;
    op_end[e.id] = e.end;
  }
  // Each tensor's evictions in op order; a D2H copy belongs to the latest eviction of its tensor
  // issued (at the end of its op) no later than the copy starts.
  std::vector<std::vector<op_index>> evicted_after(t.tensors.size());
  for (op_index k = 0; k < p.steps.size() && k < n; ++k)
    for (const auto& e : p.steps[k].evictions)
      if (e.action != evict_action::drop && e.tensor < t.tensors.size()) evicted_after[e.tensor].push_back(k);
  std::vector<std::vector<late_free>> late(n);
  for (const auto& e : sim.timeline) {
    if (e.track != sim_track::d2h || e.id >= t.tensors.size()) continue;
    const auto& ks = evicted_after[e.id];
    auto it = std::upper_bound(ks.begin(), ks.end(), e.start, [&](double s, op_index k) { return s < op_end[k] - 1e-12; });
    if (it == ks.begin()) continue;
    const op_index k = *std::prev(it);
    // The last op that starts before the copy ends: the bytes are busy through it.
    auto m = std::lower_bound(op_start.begin(), op_start.end(), e.end);
    const auto until = static_cast<op_index>(m == op_start.begin() ? 0 : (m - op_start.begin()) - 1);
    if (until > k) late[k].push_back(late_free{static_cast<tensor_id>(e.id), until});
  }
  return late;
}

fitted_plan fit_plan(const planner& pl, const trace& t, const lifetime_report& r, const hw_profile& hw,
                     std::uint64_t device_budget, double headroom, std::span<const std::int64_t> release_points,
                     std::size_t granule, int tries) {
  fitted_plan out;
  const auto least = r.min_budget_bytes;
  std::uint64_t b = device_budget - static_cast<std::uint64_t>(std::clamp(headroom, 0.0, 1.0) * static_cast<double>(device_budget));
  if (b < least) b = std::min(device_budget, least);
  for (int i = 0;; ++i) {
    out.p = pl.make_plan(t, r, hw, b);
    out.plan_budget = b;
    const auto late = late_frees_from_simulation(t, out.p, hw);
    out.layout = make_layout(t, out.p, release_points, granule, late);
    out.layout_extent = out.layout.extent;
    out.fits = out.layout_extent <= device_budget;
    if (out.fits || i >= tries || b <= least) return out;
    const std::uint64_t over = out.layout_extent - device_budget + device_budget / 64;
    b = b > least + over ? b - over : least;
  }
}

}  // namespace spillway::offload
