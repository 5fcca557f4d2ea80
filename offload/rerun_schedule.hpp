// Rerun schedules: which values a planner drops and makes again by rerunning the ops that
// wrote them (Note [Recomputation] in prefetch/plan.hpp), and where; the swap planners then
// plan the rest on a trace with the reruns folded in (Note [Rerun schedules]).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "prefetch/plan.hpp"

namespace spillway::offload::detail {

/// A value that may be dropped and made again: a transient written once, by a recomputable op,
/// and read again after an idle stretch: one with at least four times the writer's duration in
/// compute, or one where the writer's inputs are still there at its end (no chain). Dropped
/// after op `after`, made again before op `use` (the stretch with the most compute when there
/// are several).
struct remake_candidate {
  tensor_id x = 0;
  op_index writer = 0;
  op_index after = 0;
  op_index use = 0;
  double gap_seconds = 0;    ///< compute of the ops strictly inside the stretch
  double rerun_seconds = 0;  ///< the writer's own duration (its inputs may need reruns too)
};
std::vector<remake_candidate> remake_candidates(const trace& t, const lifetime_report& r, const hw_profile& hw);

/// The reruns a set of values needs, and the trace a swap planner sees with them.
struct rerun_schedule {
  /// The trace with each op's reruns folded into it: the op also writes what its reruns write,
  /// reads what they read (less what they make), and lasts as long as they and it together.
  /// None of its ops is recomputable: its reruns are these, fixed.
  trace folded;
  /// Per tensor of `folded`: the tensor of the original trace it is (a value a rerun makes
  /// again is a tensor of its own in the folded trace; the others keep their ids).
  std::vector<tensor_id> origin;
  std::vector<std::vector<op_index>> reruns;  ///< per op, in run order
  std::size_t remade = 0;                     ///< values of the set that are made again
};

/// Drops each candidate whose entry in `want` (indexed by tensor) is set and reruns its writer
/// before the read after its stretch, with the writers of its inputs first where those are
/// gone by then (chains). A value whose inputs changed since its writer ran is kept instead. A
/// chosen value a chain makes early stays from then on when `keep_made`, else it is dropped
/// again and made once more before its own read. With `spread`, a chain's reruns are spread
/// over the ops before the one it serves (Note [Rerun schedules]), so fewer of its values are
/// held at once, and none goes to an op that would hold more than `budget` bytes with it. A
/// chosen value whose entry in `again` (indexed by tensor; empty: none) is set is dropped again
/// and made once more even when `keep_made`. With `room_for_held`, a spread rerun also leaves
/// room at its op for the values no rerun can make that are held over it (a gradient written
/// before the op and read after it).
rerun_schedule schedule_reruns(const trace& t, const lifetime_report& r, const hw_profile& hw,
                               const std::vector<remake_candidate>& candidates, const std::vector<char>& want,
                               bool keep_made = true, bool spread = false, const std::vector<char>& again = {},
                               std::uint64_t budget = std::numeric_limits<std::uint64_t>::max(),
                               bool room_for_held = false);

/// Turns `folded`, a plan made for s.folded, into a plan for the trace the schedule was made
/// from (`tensors` tensors): its tensors renamed back, the reruns added to its steps. No op of
/// s.folded is recomputable, so a planner reruns none of them; usage_error if `folded` does.
plan unfold_plan(plan folded, const rerun_schedule& s, std::size_t tensors);

}  // namespace spillway::offload::detail
