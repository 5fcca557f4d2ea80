// Planner interface: the budget check every planner shares, the factory, and `none`
// (everything resident; transients dropped after their last use).
#include "offload/planner.hpp"

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/plan_builder.hpp"
#include "offload/planner_host.hpp"
#include "offload/planner_recompute.hpp"

namespace spillway::offload {

namespace detail {
std::unique_ptr<planner> make_lms_planner(const planner_options& opt);
std::unique_ptr<planner> make_vdnn_planner(bool conv_only);
std::unique_ptr<planner> make_auto_planner(const planner_options& opt);

namespace {
class none_planner final : public planner {
 public:
  std::string name() const override { return "none"; }

 private:
  plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile&, std::uint64_t budget) const override {
    return build_plan(t, r, {}, "none", budget);
  }
};
}  // namespace
}  // namespace detail

void check_budget(const trace& t, const lifetime_report& r, std::uint64_t budget) {
  if (t.ops.empty() || budget >= r.min_budget_bytes) return;
  const op_index k = r.min_budget_op;
  throw config_error("budget " + format_bytes(budget) + " (" + std::to_string(budget) +
                     " B) is below the least any plan needs: op " + std::to_string(k) + " ('" + t.ops[k].name +
                     "') needs " + format_bytes(r.min_budget_bytes) + " (" + std::to_string(r.min_budget_bytes) +
                     " B) resident at once");
}

plan planner::make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) const {
  check_budget(t, r, budget);
  if (t.ops.empty()) return plan::empty_for(t, name(), budget);  // nothing to move: every planner agrees
  return do_make_plan(t, r, hw, budget);
}

std::vector<std::string> planner_names() {
  return {"none", "lms", "vdnn-all", "vdnn-conv", "checkpoint", "capuchin", "zero-offload", "auto"};
}

std::unique_ptr<planner> make_planner(std::string_view name, const planner_options& opt) {
  if (name == "none") return std::make_unique<detail::none_planner>();
  if (name == "lms") return detail::make_lms_planner(opt);
  if (name == "vdnn" || name == "vdnn-all") return detail::make_vdnn_planner(false);
  if (name == "vdnn-conv") return detail::make_vdnn_planner(true);
  if (name == "auto") return detail::make_auto_planner(opt);
  if (name == "checkpoint") return detail::make_checkpoint_planner(opt);
  if (name == "capuchin") return detail::make_capuchin_planner(opt);
  if (name == "zero-offload") return detail::make_zero_offload_planner(opt);
  throw config_error("unknown policy '" + std::string(name) +
                     "' (none, lms, vdnn-all, vdnn-conv, checkpoint, capuchin, zero-offload, auto)");
}

}  // namespace spillway::offload
