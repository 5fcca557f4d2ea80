// The executor's reading of the trace it follows for one tensor: when it is next used (the
// order of on-demand evictions) and whether its value is dead after an op (a drop then loses
// nothing).
#include <algorithm>
#include <iterator>
#include <limits>

#include "prefetch/executor.hpp"
#include "prefetch/executor_state.hpp"

namespace spillway {

std::uint64_t executor::next_use(tensor_id id) const {
  constexpr auto never = std::numeric_limits<std::uint64_t>::max();
  const auto& st = *tensors_[id];
  if (st.released) {
    // A rerun temp a later step's rerun reads (Note [Rerun temps across steps]) is used there.
    if (!st.rerun_temp) return never;
    const op_index at = reruns_.next_rerun_read(id, current_op_);
    return at == std::numeric_limits<op_index>::max() ? never : at;
  }
  if (plan_ == nullptr || trace_ == nullptr || id >= uses_.size() || uses_[id].empty()) {
    // Recording: least recently used goes first (smaller clock = farther "next use").
    return never / 2 - st.last_used;
  }
  const auto& u = uses_[id];
  auto it = std::upper_bound(u.begin(), u.end(), current_op_);
  if (it != u.end()) return *it;
  if (is_persistent(st.desc.kind)) return trace_->ops.size() + u.front();  // next iteration
  return never;  // a transient past its last use
}

bool executor::value_dead_before_first_use(tensor_id id) const {
  if (trace_ == nullptr || id >= uses_.size() || uses_[id].empty()) return false;
  const auto& op = trace_->ops[uses_[id].front()];
  return std::find(op.writes.begin(), op.writes.end(), id) != op.writes.end() &&
         std::find(op.reads.begin(), op.reads.end(), id) == op.reads.end();
}

bool executor::value_dead_after(tensor_id id, op_index k) const {
  // Per the trace the plan follows: the next op touching the tensor overwrites it without
  // reading, or nothing touches it again (see the boundary rule below). Parameters and optimizer
  // state are never dead: an iteration that departs from the trace may read one before the op
  // that the trace says overwrites it, so a drop the plan makes of one is a copy out instead.
  if (trace_ == nullptr || id >= uses_.size() || uses_[id].empty()) return false;
  const tensor_kind kind = tensors_[id]->desc.kind;
  if (is_persistent(kind) && kind != tensor_kind::gradient) return false;
  const auto& u = uses_[id];
  auto it = std::upper_bound(u.begin(), u.end(), k);
  if (kind == tensor_kind::gradient) {
    // A gradient's value that no op has read since it was written is never dead: the op that
    // wrote it last (at or before k, else the iteration's last use) is a writer. A trace recorded
    // from a step that never read the sum (a step skipped after its backward pass) would have it
    // dropped, and the next step, which departs to read it, would find nothing (Note [Dropped
    // gradients] in executor.cpp); the value is copied out instead, as a parameter's would be.
    const op_index last = it != u.begin() ? *std::prev(it) : u.back();
    const auto& w = trace_->ops[last].writes;
    if (std::find(w.begin(), w.end(), id) != w.end()) return false;
  }
  op_index next = 0;
  if (it != u.end()) {
    next = *it;
  } else if (kind == tensor_kind::gradient) {
    // Across the iteration boundary only a gradient's value may die: the program may read
    // parameters and optimizer state between iterations (checkpoints, evaluation).
    next = u.front();
  } else {
    return !is_persistent(kind);  // a transient past its last use is dead; persistent values live on
  }
  const auto& op = trace_->ops[next];
  const bool reads = std::find(op.reads.begin(), op.reads.end(), id) != op.reads.end();
  const bool writes = std::find(op.writes.begin(), op.writes.end(), id) != op.writes.end();
  return writes && !reads;
}

}  // namespace spillway
