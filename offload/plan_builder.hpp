// Plan builder shared by the planners: they decide off-device intervals; the builder turns them
// into evictions (copy or drop), prefetches and starting tiers, and measures resident bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "offload/lifetime.hpp"
#include "offload/simulator.hpp"
#include "prefetch/plan.hpp"

namespace spillway::offload::detail {

/// A stretch during which tensor x is off the device: evicted after op `after`, back on the
/// device from op `issue` (a prefetch issued before it, when `use` reads the value) for op
/// `use`. wraps: the stretch runs over the iteration boundary: `after` is the last use in the
/// iteration and `use` the first; the tensor starts the iteration in `where`. A tensor with no
/// use at all is off the whole iteration when it has a wrap interval with after == use == 0.
struct off_interval {
  tensor_id x = 0;
  op_index after = 0;
  op_index use = 0;
  op_index issue = 0;
  tier where = tier::host;
  bool wraps = false;
  bool operator==(const off_interval&) const = default;
};

/// Builds the plan: initial tiers, evictions (drop when the value is dead or the tier holds an
/// unchanged copy, else a copy to the tier), prefetches when the next use reads (issued later
/// where an op in between has no room for them: Note [Prefetches within the budget] in
/// plan_builder.cpp), and a drop of every transient after its last use. Intervals must not
/// overlap per tensor.
plan build_plan(const trace& t, const lifetime_report& r, std::vector<off_interval> intervals,
                std::string policy, std::uint64_t budget);

/// Device bytes resident during each op under the intervals (the no-swap live bytes minus
/// what is off): persistent tensors from the start, transients from first write to last use.
std::vector<std::int64_t> resident_bytes(const trace& t, const lifetime_report& r,
                                         const std::vector<off_interval>& intervals);

/// Keeps the best of several candidate plans: a feasible one before an infeasible one, then the
/// one with the shorter simulated step.
class best_plan {
 public:
  void offer(plan p, const sim_result& s) {
    const bool ok = s.feasible();
    if (!have_ || (ok && !ok_) || (ok == ok_ && s.step_seconds < seconds_)) {
      best_ = std::move(p);
      seconds_ = s.step_seconds;
      ok_ = ok;
      have_ = true;
    }
  }
  [[nodiscard]] plan take() { return std::move(best_); }

 private:
  plan best_;
  double seconds_ = 0;
  bool ok_ = false;
  bool have_ = false;
};

}  // namespace spillway::offload::detail
