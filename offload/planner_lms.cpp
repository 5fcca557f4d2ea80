// lms: TFLMS-style swapping (Le et al., "TFLMS: Large Model Support in TensorFlow by Graph
// Rewriting"): a tensor idle for swapout_threshold ops or more goes to the host after its use
// and comes back swapin_ahead ops before the next one (later where an op in between has no room
// for it: Note [Prefetches within the budget] in plan_builder.cpp); nearby swap-ins are grouped.
#include <algorithm>
#include <limits>

#include "offload/plan_builder.hpp"
#include "offload/planner.hpp"
#include "offload/simulator.hpp"

namespace spillway::offload::detail {

namespace {

struct lms_knobs {
  std::uint32_t threshold = 1, ahead = 1, groupby = 1;
};

std::vector<off_interval> lms_intervals(const trace& t, const lifetime_report& r, const lms_knobs& k) {
  std::vector<off_interval> out;
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    const auto& lt = r.tensors[x];
    if (!lt.used()) {
      if (is_persistent(t.tensors[x].kind)) out.push_back({x, 0, 0, 0, tier::host, true});
      continue;
    }
    if (!may_leave_device(t.tensors[x].kind)) continue;  // a metric stays from first write to last use
    for (const auto& g : lt.gaps) {
      if (g.ops < k.threshold) continue;
      off_interval iv{x, g.after, g.before, g.before, tier::host, g.wraps};
      if (g.contents_needed) {
        std::int64_t issue = static_cast<std::int64_t>(g.before) - k.ahead;
        if (k.groupby > 1) issue -= issue % k.groupby;  // group swap-ins on a grid of groupby ops
        const std::int64_t lo = g.wraps ? 0 : static_cast<std::int64_t>(g.after) + 1;
        iv.issue = static_cast<op_index>(std::clamp<std::int64_t>(issue, lo, g.before));
      }
      out.push_back(iv);
    }
  }
  return out;
}

class lms_planner final : public optioned_planner {
 public:
  explicit lms_planner(const planner_options& o) : optioned_planner("lms", o) {}

 private:
  plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) const override {
    const auto& o = options();
    lms_knobs fixed{o.swapout_threshold.value_or(1), o.swapin_ahead.value_or(1), o.swapin_groupby.value_or(1)};
    const bool tune = o.lms_autotune && !o.swapout_threshold && !o.swapin_ahead && !o.swapin_groupby;
    if (!tune) return build_plan(t, r, lms_intervals(t, r, fixed), "lms", budget);
    // Largest threshold whose resident bytes fit (fewest swaps), then the best swap-in distance.
    const auto n = static_cast<std::uint32_t>(t.ops.size());
    std::vector<std::uint32_t> thresholds;
    for (std::uint32_t th = std::max<std::uint32_t>(n, 1); th >= 1; th /= 2) thresholds.push_back(th);
    if (thresholds.back() != 1) thresholds.push_back(1);
    lms_knobs best_knobs = fixed;
    for (auto th : thresholds) {
      lms_knobs k{th, 1, 1};
      const auto res = resident_bytes(t, r, lms_intervals(t, r, k));
      if (*std::max_element(res.begin(), res.end()) <= static_cast<std::int64_t>(budget)) {
        best_knobs = k;
        break;
      }
    }
    best_plan best;
    for (std::uint32_t ahead : {1u, 2u, 4u, 8u, 16u}) {
      lms_knobs k = best_knobs;
      k.ahead = ahead;
      plan p = build_plan(t, r, lms_intervals(t, r, k), "lms", budget);
      const auto s = simulate(t, r, p, hw);
      best.offer(std::move(p), s);
    }
    return best.take();
  }
};

}  // namespace

std::unique_ptr<planner> make_lms_planner(const planner_options& opt) { return std::make_unique<lms_planner>(opt); }

}  // namespace spillway::offload::detail
