// Which drops of a plan discard a value that a later recomputation remakes (Note [Recomputation]
// in prefetch/plan.hpp). The executor and make_layout ask the same question, so it is answered here.
#pragma once

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
// It is freed after the step's op, unless a rerun of a later step reads it (a chain spread over
// several steps: Note [Rerun schedules] in offload/rerun_schedule.cpp) and nothing makes it
// again before that read; then it is kept, and its next use is that step, until the last such
// step has run. make_layout keeps it placed as long.

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

 private:
  const trace* t_ = nullptr;
  std::vector<std::vector<op_index>> writes_;  // per tensor, ops that write it (ascending)
  std::vector<std::vector<op_index>> reads_;   // per tensor, ops that read it (ascending)
  std::vector<std::vector<op_index>> reruns_;  // per op, the steps that rerun it (ascending)
  std::vector<std::vector<op_index>> rerun_reads_;  // per tensor, the steps whose reruns read it (ascending)
};

}  // namespace spillway
