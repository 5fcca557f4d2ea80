// Planners behind one interface: each turns a trace, its lifetimes, a hardware profile and a
// device budget into a Plan (prefetch/plan.hpp). Built-ins: none, lms, vdnn-all, vdnn-conv,
// checkpoint, capuchin, zero-offload, auto.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "prefetch/plan.hpp"

namespace spillway::offload {

/// Knobs; each planner reads its own and ignores the rest.
struct planner_options {
  /// lms (TFLMS): swap a tensor out when it stays idle for at least this many ops ...
  std::optional<std::uint32_t> swapout_threshold;
  /// ... and start bringing it back this many ops before its next use ...
  std::optional<std::uint32_t> swapin_ahead;
  /// ... issuing swap-ins whose points lie within this many ops of each other together.
  std::optional<std::uint32_t> swapin_groupby;
  /// When lms knobs are not given, lms tries a small grid and keeps the fastest plan that fits
  /// (as TFLMS users tune by hand). Set false to use the defaults 1 / 1 / 1 untuned.
  bool lms_autotune = true;
  /// auto: the sweep's eviction limits, each as the fraction of (budget - least budget) the
  /// sweep keeps free while choosing what to evict, so prefetches have room to start early; each
  /// is simulated and the fastest feasible kept. A search over plans within the budget, not
  /// headroom (Note [Headroom] in allocator/device_budget.hpp).
  std::vector<double> auto_sweep_reserves = {0.0, 0.05, 0.15, 0.3};
  /// auto: how much the sweep shuns evicting a value whose copy out could not finish before
  /// its memory is needed (0: not at all); one sweep per weight and sweep reserve.
  std::vector<double> auto_late_weights = {0.0, 4.0, 16.0};
  /// auto: shares of the values written in the iteration and read by the next that the best
  /// sweeps try keeping on the device over the boundary (their copy out moves to the start).
  std::vector<double> auto_keep_shares = {0.25, 0.5, 0.75, 1.0};
  /// auto: the best sweeps also try their prefetches later, each at the latest op that leaves
  /// this many times its copy's time of compute before its use (never earlier than memory
  /// allows; Note [Late prefetches] in planner_auto.cpp). Empty: only as early as memory allows.
  std::vector<double> auto_prefetch_leads = {3.0, 8.0};
  /// auto: the best sweeps also try homing in the host tier the values the iteration writes
  /// and the next one reads that leave the device mid-iteration with a copy out (Note [Homed
  /// state] in planner_auto.cpp).
  bool auto_home_state = true;
  /// auto: also plan with recomputation where the trace has recomputable ops (Note
  /// [Recomputing planners] in planner_recompute.cpp) ...
  bool auto_recompute = true;
  /// ... trying to remake each of these shares of the values that could be remade, those
  /// that free the most bytes per second of rerun first.
  std::vector<double> auto_remake_shares = {0.25, 0.5, 1.0};
  /// auto: rounds of its last stage, which makes reruns of the copies its best plan still waits
  /// for (Note [Recomputing planners]); 0 skips it.
  std::uint32_t auto_stall_rounds = 8;
  /// auto: candidates its stage 4 may try, each one value dropped or kept more than its best
  /// plan does (Note [Recomputing planners]); 0 skips it.
  std::size_t auto_toggle_evaluations = 300;
  /// auto: where its best plan's compute waits on copies of transients for over a quarter of
  /// its step, the whole recomputing search runs again with each spread rerun leaving room for
  /// the values held over its op (Note [Recomputing planners]); false skips it.
  bool auto_room_for_held = true;
  /// auto: where its compute waits for at least 5% of the step on copies of one value that may
  /// not be remade, beside the search that keeps that value on the device, one that also keeps
  /// the values whose copies held its copies up in their queue (Note [Recomputing planners], the
  /// queued search); false skips it.
  bool auto_queued_search = true;
  /// auto: traces of up to this many ops get the whole recomputing search; longer ones a
  /// shorter one (Note [Recomputing planners]): planning time grows with the trace.
  std::size_t auto_fine_search_ops = 5000;
};

class planner {
 public:
  virtual ~planner() = default;
  [[nodiscard]] virtual std::string name() const = 0;

  /// Plans one iteration of `t` (analyzed as `r`) for a device budget of `budget` bytes.
  /// Throws config_error naming the op and the bytes it needs when `budget` is below the
  /// least any plan needs (the largest single-op working set). A planner that cannot keep
  /// the budget (none, vdnn) still returns its plan; the simulator reports it infeasible.
  /// Several threads may call it at once on one planner: a planner keeps nothing between calls.
  [[nodiscard]] plan make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw,
                               std::uint64_t budget) const;

 private:
  virtual plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw,
                            std::uint64_t budget) const = 0;
};

/// "none", "lms", "vdnn-all", "vdnn-conv" (also "vdnn" = vdnn-all), "checkpoint", "capuchin",
/// "zero-offload", "auto". checkpoint, capuchin, zero-offload and auto recompute where the trace
/// marks ops recomputable; zero-offload and auto place host_capable ops on the host where the
/// profile runs host ops (Note [Host placement] in planner_host.cpp).
std::unique_ptr<planner> make_planner(std::string_view name, const planner_options& opt = {});
std::vector<std::string> planner_names();

/// Throws config_error when `budget` is below the largest single-op working set.
void check_budget(const trace& t, const lifetime_report& r, std::uint64_t budget);

namespace detail {
/// The shape of a planner that reads its knobs from planner_options (lms, auto): a name and
/// the options, kept for do_make_plan.
class optioned_planner : public planner {
 public:
  optioned_planner(std::string name, const planner_options& options) : name_(std::move(name)), options_(options) {}
  [[nodiscard]] std::string name() const override { return name_; }

 protected:
  [[nodiscard]] const planner_options& options() const noexcept { return options_; }

 private:
  std::string name_;
  planner_options options_;
};
}  // namespace detail

}  // namespace spillway::offload
