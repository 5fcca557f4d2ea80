// Which drops of a plan discard a value that a later recomputation remakes (Note [Recomputation]
// in prefetch/plan.hpp). The executor and make_layout ask the same question, so it is answered here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "prefetch/plan.hpp"
#include "prefetch/trace.hpp"

namespace spillway {

// Note [Drops for recomputation]
// A plan's "drop" of a transient that holds the only copy of its value normally keeps the tensor
// resident until release() (Note [Transients live until release] in executor.cpp), because the
// loop may still need the value. When the op that last wrote the value is recomputable and the
// plan reruns it (a recomputes entry of a step after the drop, at or before the value's next read
// in the trace), the drop is real: the memory goes back at once, and the rerun makes the value
// again. A read that comes first (the run departed from the plan) is an error naming the tensor.

// Note [Rerun temps across steps]
// A rerun may make a value the program has already released (a value dead after its last use
// that a chain needs as an input): a rerun temp (Note [Rerun checks] in executor_recompute.cpp).
// It is freed after the step's op (before it where the op does not touch it: Note [Rerun temps
// before the op]), unless a rerun of a later step reads it (a chain spread over
// several steps: Note [Rerun schedules] in offload/rerun_schedule.cpp) and nothing makes it
// again before that read; then it is kept, and its next use is that step, until the last such
// step has run. make_layout keeps it placed as long.

// Note [Rerun temps before the op]
// A rerun temp that op k neither reads nor writes and that no later step's rerun reads is freed
// once the reruns of step k have run, before op k's own tensors are placed: its bytes serve
// them. So a chain through a value nothing else needs (a layer's pre-activation, dead in the
// program, that a rerun of the activation reads) holds at its peak the larger of the chain and
// the op, not their sum. The executor, make_layout and the simulator free it at that point
// alike (rerun_index::freed_before_op), and a planner's folded trace counts it so (Note [Rerun
// schedules] in offload/rerun_schedule.cpp). The slot of the reruns' allocations is
// layout_slot::rerun(k), before layout_slot::place(k), where op k's own are made.

/// Answers "does the drop of x after op k await a rerun?" for one trace and plan.
class rerun_index {
 public:
  rerun_index() = default;
  rerun_index(const trace& t, const plan& p);
  /// True when x is transient, its last writer up to op k is recomputable, and a step after k, at
  /// or before x's next read, reruns that writer.
  [[nodiscard]] bool drop_awaits_rerun(tensor_id x, op_index k) const;
  /// The op whose rerun remakes x after op k, if drop_awaits_rerun(x, k).
  [[nodiscard]] op_index writer_before(tensor_id x, op_index k) const;
  /// The first step after k whose reruns read x, when no rerun of x's writer in the steps
  /// after k up to it makes x again first (Note [Rerun temps across steps]); none otherwise
  /// (the largest op_index).
  [[nodiscard]] op_index next_rerun_read(tensor_id x, op_index k) const;
  /// True when x, made by a rerun at or before step k, is freed once step k's reruns have run
  /// (Note [Rerun temps before the op]): x is transient, no op from k on reads it, op k does
  /// not write it, and no later step's rerun reads it.
  [[nodiscard]] bool freed_before_op(tensor_id x, op_index k) const;

 private:
  /// Ascending op indices per key, in one array (a simulator builds an index per plan).
  struct lists {
    std::vector<std::uint32_t> start;  // key i's entries: items[start[i], start[i + 1])
    std::vector<op_index> items;
    [[nodiscard]] std::span<const op_index> operator[](std::size_t i) const {
      return {items.data() + start[i], items.data() + start[i + 1]};
    }
    [[nodiscard]] std::size_t size() const { return start.empty() ? 0 : start.size() - 1; }
  };
  const trace* t_ = nullptr;
  lists writes_;       // per tensor, ops that write it
  lists reads_;        // per tensor, ops that read it
  lists reruns_;       // per op, the steps that rerun it
  lists rerun_reads_;  // per tensor, the steps whose reruns read it
};

}  // namespace spillway
