// Recomputation in the executor: the plan's reruns before an op (Note [Recomputation] in
// plan.hpp), the checks that a rerun gives the bits its op gave, and values dropped for a rerun.
#include <algorithm>
#include <limits>
#include <optional>

#include "device/error.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_state.hpp"

namespace spillway {

// Note [Rerun checks]
// A rerun of op o before op k gives o's bits only when o's inputs hold the values they held when
// o ran, and it must not put back an old value over a newer one in o's outputs. The planner and
// the simulator never plan such a rerun, but the loop may not be what was recorded, so the
// executor checks, cheaply: every tensor counts the values it has held (`version`, one more per
// op that writes it and per upload), and for each recomputable op of the iteration the executor
// notes the versions of its reads when it runs and of its writes when it ends. A rerun whose
// read or write has another version now, or that was never run in this iteration, is a
// usage_error naming both ops and the tensor, before any work of the rerun is enqueued. A rerun
// writes the same bits, so it counts no new version and leaves tier copies current. An output
// the program has already released (one only a later rerun reads) is made for the step and
// freed once the step's reruns have run where op k does not touch it (Note [Rerun temps before
// the op] in recompute.hpp), else after op k, or after the last later step whose reruns read it
// (Note [Rerun temps across steps]).

namespace {
std::string op_name(const trace* t, op_index o) {
  std::string s = "op " + std::to_string(o);
  if (t != nullptr && o < t->ops.size()) s += " (\"" + t->ops[o].name + "\")";
  return s;
}
}  // namespace

void executor::note_op_inputs(op_index k, std::span<const tensor_id> reads) {
  if (plan_ == nullptr || trace_ == nullptr || k >= trace_->ops.size() || !trace_->ops[k].recomputable) return;
  if (ran_.size() <= k) ran_.resize(trace_->ops.size());
  auto& r = ran_[k];
  r.ran = false;
  r.reads.clear();
  r.writes.clear();
  for (auto id : reads) r.reads.emplace_back(id, state(id).version);
}

void executor::note_op_outputs(op_index k) {
  if (k >= ran_.size() || plan_ == nullptr) return;
  auto& r = ran_[k];
  if (!trace_->ops[k].recomputable) return;
  for (auto id : writes_) r.writes.emplace_back(id, state(id).version);
  r.ran = true;
}

void executor::throw_awaiting_rerun(const tensor_state& st, const std::string& reader) const {
  std::string by = "a recomputation";
  if (trace_ != nullptr) {
    const auto id = static_cast<tensor_id>(std::find_if(tensors_.begin(), tensors_.end(),
                                                        [&](const auto& t) { return t.get() == &st; }) -
                                           tensors_.begin());
    const op_index w = reruns_.writer_before(id, current_op_);
    if (w < trace_->ops.size()) by = "a rerun of " + op_name(trace_, w);
  }
  throw usage_error("executor: " + reader + " reads tensor \"" + st.desc.name +
                    "\", whose value the plan dropped for " + by +
                    " that has not run before it; the plan must recompute it before this read, or keep or save the value");
}

namespace {
/// Reruns borrow the open op's pinned and written lists; this gives them back, however they end.
class op_lists_kept {
 public:
  op_lists_kept(std::vector<tensor_id>& pinned, std::vector<tensor_id>& writes)
      : pinned_(pinned), writes_(writes), pinned_before_(pinned), writes_before_(writes) {}
  op_lists_kept(const op_lists_kept&) = delete;
  op_lists_kept& operator=(const op_lists_kept&) = delete;
  ~op_lists_kept() {
    pinned_ = std::move(pinned_before_);
    writes_ = std::move(writes_before_);
  }

 private:
  std::vector<tensor_id>& pinned_;
  std::vector<tensor_id>& writes_;
  std::vector<tensor_id> pinned_before_, writes_before_;
};
}  // namespace

void executor::run_recomputes(op_index k) {
  const std::vector<tensor_id> own = pinned_;  // op k's reads and writes
  {
    const op_lists_kept kept{pinned_, writes_};
    std::vector<tensor_id> made;  // outputs of this step's reruns so far: kept for later entries
    for (op_index o : plan_->steps[k].recomputes) rerun(o, k, made);
  }
  // Note [Rerun temps before the op]: the temps op k does not touch go now, in compute's order.
  std::vector<tensor_id> kept;
  for (auto id : rerun_temps_) {
    if (std::find(own.begin(), own.end(), id) != own.end() || !reruns_.freed_before_op(id, k)) {
      kept.push_back(id);
      continue;
    }
    state(id).rerun_temp = false;
    retire(id);
  }
  rerun_temps_ = std::move(kept);
}

void executor::rerun(op_index o, op_index k, std::vector<tensor_id>& made) {
  const std::string who = "executor: recomputation of " + op_name(trace_, o) + " before " + op_name(trace_, k);
  SPILLWAY_EXPECTS_T(usage_error, static_cast<bool>(rerun_),
                     who + ": no rerun callback is set (executor::set_rerun); the executor cannot run the op again");
  SPILLWAY_EXPECTS_T(usage_error, o < ran_.size() && ran_[o].ran,
                     who + ": the op has not run in this iteration, so there is nothing to recompute");
  const auto& rec = ran_[o];
  // Note [Rerun checks]: before any work is enqueued.
  for (const auto& [id, v] : rec.reads) {
    const auto& st = state(id);
    SPILLWAY_EXPECTS_T(usage_error, !st.released || st.rerun_temp,
                       who + ": its input \"" + st.desc.name + "\" was released by the program since the op ran");
    SPILLWAY_EXPECTS_T(usage_error, st.version == v,
                       who + ": its input \"" + st.desc.name +
                           "\" was written again since the op ran, so the rerun would not give the same bits; "
                           "recompute before that write, or keep the output");
  }
  for (const auto& [id, v] : rec.writes) {
    const auto& st = state(id);
    SPILLWAY_EXPECTS_T(usage_error, st.released || st.version == v,
                       who + ": its output \"" + st.desc.name +
                           "\" was written again since the op ran; the rerun would put back the older value");
  }
  std::vector<tensor_id> reads, writes;
  for (const auto& r : rec.reads) reads.push_back(r.first);
  for (const auto& w : rec.writes) writes.push_back(w.first);
  pinned_ = reads;
  pinned_.insert(pinned_.end(), writes.begin(), writes.end());
  pinned_.insert(pinned_.end(), made.begin(), made.end());
  writes_ = writes;
  for (auto id : pinned_) state(id).last_used = clock_;
  alloc_slot_ = layout_slot::rerun(k);
  place_op_tensors(reads, writes);  // defragments where the free memory is in pieces
  check_loads(reads);
  for (auto id : writes) {
    auto& st = state(id);
    if (st.released && !st.rerun_temp) {
      st.rerun_temp = true;
      rerun_temps_.push_back(id);
    }
    // A copy out of the old value may still be reading it; the same bits, but in order.
    if (st.pending_save.valid() && !st.pending_save.ready()) st.pending_save.stream_wait(*device_, compute_);
  }
  wait_pinned();
  timeline_item* item =
      options_.timeline ? stamp_start(compute_, timeline_item::track::recompute, "rerun: " + op_name(trace_, o)) : nullptr;
  op_open_ = true;
  try {
    rerun_(o);
  } catch (...) {
    op_open_ = false;
    free_scratch();
    throw;
  }
  op_open_ = false;
  stamp_end(compute_, item);
  free_scratch();
  op_done_current_ = false;  // the rerun's work is enqueued after the last op_done_
  for (auto id : writes) {   // the same bits: tier copies stay current, no new version
    auto& st = state(id);
    st.dev_valid = true;
    st.awaiting_rerun = false;
  }
  made.insert(made.end(), writes.begin(), writes.end());
  ++stats_.recomputes;
}

// Note [Reruns on demand]
// An iteration that departs from the trace (abandon_plan) may read a value that the plan dropped
// for a rerun due later, or one the program released that only such a rerun would have made
// again. The op that made it ran earlier in this iteration and its body is still at hand, so the
// executor runs it again before the reading op, first remaking the same way any input of it that
// is itself dropped or released (a chain; each writer precedes the one that reads its output).
// Before an op that overwrites an input of such an op (an in-place op the trace did not have),
// the values it dropped are made at once, while the input still holds what the op read.
// Note [Rerun checks] holds unchanged: an input written again since the op ran is a usage_error
// naming the op and the tensor. While the plan is followed, a read of a value it dropped with no
// rerun before it is the plan's fault, and stays an error (throw_awaiting_rerun).

bool executor::dropped_for_rerun(tensor_id id) {
  const auto& st = state(id);
  return st.awaiting_rerun && st.dev == nullptr && !st.tier_current;
}

void executor::run_reruns_on_demand(op_index k, std::span<const tensor_id> reads, std::span<const tensor_id> writes) {
  std::vector<tensor_id> todo;
  for (auto id : reads)
    if (dropped_for_rerun(id)) todo.push_back(id);
  // A value whose op read what this op writes is made now, while that input still holds it. The
  // ops that ran before the departure are all there will be: index their reads once.
  if (ran_readers_.empty() && !ran_.empty()) {
    ran_readers_.resize(tensors_.size());
    for (op_index o = 0; o < ran_.size(); ++o)
      if (ran_[o].ran)
        for (const auto& in : ran_[o].reads) ran_readers_[in.first].push_back(o);
  }
  for (auto w : writes) {
    if (w >= ran_readers_.size()) continue;
    for (op_index o : ran_readers_[w])
      for (const auto& out : ran_[o].writes)
        if (dropped_for_rerun(out.first)) todo.push_back(out.first);
  }
  if (todo.empty()) return;
  const op_lists_kept kept{pinned_, writes_};
  std::vector<tensor_id> made;
  for (auto id : todo)
    if (dropped_for_rerun(id)) remake(id, static_cast<op_index>(ran_.size()), k, made);
}

void executor::remake(tensor_id id, op_index before, op_index k, std::vector<tensor_id>& made) {
  // The last recomputable op before `before` that wrote the tensor in this iteration.
  auto writer = [&](tensor_id t, op_index below) -> std::optional<op_index> {
    for (op_index o = std::min<op_index>(below, static_cast<op_index>(ran_.size())); o-- > 0;) {
      const auto& w = ran_[o].writes;
      if (ran_[o].ran && std::any_of(w.begin(), w.end(), [&](const auto& p) { return p.first == t; })) return o;
    }
    return std::nullopt;
  };
  const auto o = writer(id, before);
  if (!o) throw_awaiting_rerun(state(id), "op " + std::to_string(k) + " (\"" + current_name_ + "\")");
  for (const auto& [in, v] : ran_[*o].reads) {
    const auto& st = state(in);
    // A released input no recomputable op made is left to rerun(), which names it.
    if (dropped_for_rerun(in) || (st.released && !st.rerun_temp && writer(in, *o))) remake(in, *o, k, made);
  }
  rerun(*o, k, made);
}

void executor::free_rerun_temps(op_index k) {
  // Note [Rerun temps across steps]: one a later step's rerun reads stays until then. With the
  // plan abandoned no later step reruns anything.
  const bool last = plan_ == nullptr || trace_ == nullptr || k + 1 >= trace_->ops.size();
  std::vector<tensor_id> kept;
  for (auto id : rerun_temps_) {
    if (!last && reruns_.next_rerun_read(id, k) != std::numeric_limits<op_index>::max()) {
      kept.push_back(id);
      continue;
    }
    state(id).rerun_temp = false;
    retire(id);  // its device memory, and a tier copy an on-demand eviction made
  }
  rerun_temps_ = std::move(kept);
}

}  // namespace spillway
