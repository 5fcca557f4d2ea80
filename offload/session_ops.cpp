// Session ops and host reads: how an op's lists, as the loop names them (parents, views,
// accumulations), become the trace's reads and writes and the executor's work.
#include <algorithm>
#include <cstring>

#include "offload/session_call.hpp"
#include "offload/session_impl.hpp"

namespace spillway {

namespace {
bool names(std::span<const tensor_handle> list, tensor_id id) {
  return std::any_of(list.begin(), list.end(), [&](tensor_handle x) { return x.id == id; });
}
void add_once(std::vector<tensor_id>& list, tensor_id id) {
  if (std::find(list.begin(), list.end(), id) == list.end()) list.push_back(id);
}
}  // namespace

// Note [Accumulation]
// An op that accumulates into a tensor (+=, as backward passes add into gradients) is
// recorded as what it does to the value: when no op of the iteration has touched the tensor
// yet, the library zero-fills it on the compute stream before the op's own work, so the op
// only writes it (no old value is needed, none is fetched); once an op has read or written it
// in the iteration (an earlier accumulation, or an op that set it), it is read and written.
// The trace, the planner and the executor need nothing more. For a parent with views the rule
// holds piece by piece.
std::uint32_t session_impl::open_op(std::string_view name, std::span<const tensor_handle> reads,
                                    std::span<const tensor_handle> writes,
                                    std::span<const tensor_handle> accumulates, double flops, op_phase phase,
                                    bool recomputable, double host_bytes) try {
  const std::string op_name(name);
  SPILLWAY_EXPECTS_T(usage_error, in_iteration, "op \"" + op_name + "\" outside begin_iteration()/end_iteration()");
  SPILLWAY_EXPECTS_T(usage_error, !op_open, "op \"" + op_name + "\" started inside another op's scope");
  ++ops_opened;
  // The tensors as the loop names them.
  std::vector<named_tensor> named;
  auto note = [&](tensor_handle t, bool is_read, bool is_written) {
    check_handle(t);
    auto it = std::find_if(named.begin(), named.end(), [&](const named_tensor& n) { return n.id == t.id; });
    if (it == named.end()) it = named.insert(named.end(), named_tensor{t.id, false, false, nullptr});
    it->read = it->read || is_read;
    it->written = it->written || is_written;
  };
  for (auto t : reads) note(t, true, false);
  for (auto t : writes) note(t, false, true);
  for (auto t : accumulates) {
    SPILLWAY_EXPECTS_T(usage_error, !names(writes, t.id),
                       "op \"" + op_name + "\" lists tensor \"" + tensors[t.id].name +
                           "\" in both its writes and its accumulations; an op either overwrites a tensor or adds into it");
    note(t, true, true);
  }
  for (const auto& n : named) {  // a parent and its own view in one op would alias (Note [Views])
    auto p = parent_of.find(n.id);
    if (p == parent_of.end()) continue;
    const bool parent_too =
        std::any_of(named.begin(), named.end(), [&](const named_tensor& m) { return m.id == p->second; });
    SPILLWAY_EXPECTS_T(usage_error, !parent_too,
                       "op \"" + op_name + "\" names both \"" + tensors[p->second].name + "\" and its view \"" +
                           tensors[n.id].name + "\"; name the parent (it covers its views) or only views");
  }
  // The trace's lists, over pieces.
  op_desc d;
  d.name = op_name;
  d.flops = flops;
  d.phase = phase;
  d.recomputable = recomputable;
  std::vector<tensor_id> zero, summed;
  for (auto t : reads)
    for (auto id : pieces_of(t.id)) add_once(d.reads, id);
  for (auto t : writes)
    for (auto id : pieces_of(t.id)) add_once(d.writes, id);
  const std::size_t consumed = d.reads.size(), overwritten = d.writes.size();  // before accumulations join them
  for (auto t : accumulates) {
    for (auto id : pieces_of(t.id)) {
      summed.push_back(id);
      const bool first = !touched.contains(id) && std::find(d.reads.begin(), d.reads.end(), id) == d.reads.end() &&
                         std::find(zero.begin(), zero.end(), id) == zero.end();
      if (first) {
        zero.push_back(id);
      } else {
        add_once(d.reads, id);
      }
      add_once(d.writes, id);
    }
  }
  for (auto id : d.reads) d.bytes += tensors[id].bytes;
  for (auto id : d.writes) d.bytes += tensors[id].bytes;
  if (host_bytes >= 0) {  // Session::host_capable_op
    d.host_capable = true;
    d.host_flops = flops;
    d.host_bytes = host_bytes > 0 ? static_cast<std::uint64_t>(host_bytes) : d.bytes;
  }
  // Note [Views]: a named parent is gathered into one buffer, placed with the op's tensors.
  std::vector<std::uint64_t> gathers;
  std::uint64_t gather_bytes = 0;
  for (const auto& n : named) {
    if (!is_split(n.id)) continue;
    gathers.push_back(tensors[n.id].bytes);
    gather_bytes += device_budget::placed(tensors[n.id].bytes);
  }

  check_sums(op_name, std::span(d.reads).first(consumed), zero, std::span(d.writes).first(overwritten), summed);

  const auto k = static_cast<op_index>(ops.size());
  if (following && !matches(k, d)) {
    following = false;
    exec->abandon_plan();
  }
  ops.push_back(d);
  bodies.emplace_back();
  op_gather.push_back(gather_bytes);
  touched.insert(d.reads.begin(), d.reads.end());
  touched.insert(d.writes.begin(), d.writes.end());
  for (const auto& n : named) named_ever.insert(n.id);
  if (d.host_capable && following && exec->placed_on_host(k)) {  // Note [Host ops in the executor]
    host_ptrs = exec->begin_host_op(k, d.reads, d.writes, d.name);
    op_open = true;
    op_thread = std::this_thread::get_id();
    open_on_host = true;
    open_named = std::move(named);
    return k;
  }
  const auto buffers = [&] {
    if (following) return exec->begin_op(k, d.reads, d.writes, d.name, gathers);
    try {
      return exec->begin_op(k, d.reads, d.writes, d.name, gathers);
    } catch (const out_of_memory& e) {
      // Recording: the ops after this one are not known yet, so neither is the least budget.
      throw out_of_memory(std::string(e.what()) +
                          " (while recording an iteration, before any plan: a later op may need more; the least "
                          "budget of the whole iteration is known once one has run, e.g. with device_budget_ratio, "
                          "which records at the whole device)");
    }
  }();
  op_open = true;
  op_thread = std::this_thread::get_id();
  open_named = std::move(named);
  try {
    const stream s = exec->compute_stream();
    for (auto id : zero) dev->memset_async(exec->device_ptr(id), 0, tensors[id].bytes, s);
    // Pieces the op only writes need no copy into the buffer.
    std::size_t next_buffer = 0;
    for (auto& n : open_named) {
      if (!is_split(n.id)) continue;
      n.gather = buffers.at(next_buffer++);
      if (!n.read) continue;
      for (const auto& pc : splits.at(n.id).pieces)
        dev->copy_async(static_cast<std::byte*>(n.gather) + pc.offset, exec->device_ptr(pc.id),
                        tensors[pc.id].bytes, copy_kind::device_to_device, s);
    }
  } catch (...) {
    // No op_scope will end the op: the executor's goes now (Note [Abandoned ops] in
    // prefetch/executor_failures.cpp), and the step has failed (Note [Failed iterations]).
    op_open = false;
    open_named.clear();
    try {
      exec->abandon_op();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the first error is the one reported
    }
    throw;
  }
  return k;
} catch (...) {
  note_failure();
  throw;
}

void session_impl::end_op(std::uint32_t k) try {
  if (!op_open) return;  // the iteration was given up with the op's scope alive (abandon_iteration)
  op_open = false;
  if (open_on_host) {
    open_on_host = false;
    open_named.clear();
    host_ptrs.clear();
    exec->end_host_op(k);
    return;
  }
  std::exception_ptr failure;
  try {
    const stream s = exec->compute_stream();
    for (const auto& n : open_named) {  // scatter back what the op wrote (Note [Views])
      if (n.gather == nullptr || !n.written) continue;
      for (const auto& pc : splits.at(n.id).pieces)
        dev->copy_async(exec->device_ptr(pc.id), static_cast<const std::byte*>(n.gather) + pc.offset,
                        tensors[pc.id].bytes, copy_kind::device_to_device, s);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  open_named.clear();
  exec->end_op(k);
  if (failure) std::rethrow_exception(failure);
} catch (...) {
  note_failure();
  throw;
}

void* session_impl::op_ptr(tensor_handle t) const {
  const auto& d = ops.at(rerunning ? *rerunning : ops.size() - 1);
  auto it = std::find_if(open_named.begin(), open_named.end(), [&](const named_tensor& n) { return n.id == t.id; });
  SPILLWAY_EXPECTS_T(usage_error, op_open && it != open_named.end(),
                     "op \"" + d.name + "\" asked for the pointer of tensor " +
                         (t.id < tensors.size() ? "\"" + tensors[t.id].name + "\"" : std::to_string(t.id)) +
                         ", which it does not name in its reads, writes or accumulations");
  // A transient the loop released inside this op (freed once the op's work queued so far is
  // done) has no pointer to hand out; a rerun of the op still reads it (the library keeps it).
  SPILLWAY_EXPECTS_T(usage_error, rerunning || !added.contains(t.id) || live.contains(t.id),
                     "op \"" + d.name + "\" asked for the pointer of tensor \"" + tensors[t.id].name +
                         "\", which the loop released inside the op; take its pointers and queue its work "
                         "before releasing it");
  return it->gather != nullptr ? it->gather : exec->device_ptr(t.id);
}

// Note [Metrics after the step]
// A loop written without Spillway in mind prints its loss after the step: the read comes after
// end_iteration(), when every transient's value has ended with its iteration. So end_iteration
// copies the value of each transient of kind metric that an op of the iteration wrote and that
// it did not release (added in the iteration, or added once and written every step) to the host, and read() between iterations gives that copy, until the next
// begin_iteration(). Metrics are what the host reads, and small, so the copies cost next to
// nothing, and nothing is kept of other kinds: a read of another transient between iterations is
// a usage_error that says how to read it. The copy counts as the host's read of the value (Note
// [Sums no op read]).
void session_impl::keep_metrics() {
  for (const auto id : touched) {  // added this iteration, or added once and written every step
    if (tensors[id].kind != tensor_kind::metric || !holds_value(id)) continue;
    auto& copy = last_metrics[id];
    copy.resize(tensors[id].bytes);
    try {
      exec->read(id, copy.data());
    } catch (...) {  // the device's or tier's error is the iteration's, reported by its end
      last_metrics.erase(id);
      continue;
    }
    unread_sums.erase(id);
  }
}

void session_impl::read(tensor_handle t, void* host) try {
  check_handle(t);
  finalize_views();
  if (!in_iteration && !is_persistent(tensors[t.id].kind)) {
    const auto kept = last_metrics.find(t.id);
    SPILLWAY_EXPECTS_T(usage_error, kept != last_metrics.end(),
                       "read(\"" + tensors[t.id].name + "\") between iterations: a transient's value ends with its " +
                           "iteration. Read it inside the iteration, after the op that writes it; or add it as a " +
                           "tensor_kind::metric and do not release() it, and its last value stays readable until " +
                           "the next begin_iteration()");
    std::memcpy(host, kept->second.data(), kept->second.size());
    return;
  }
  if (in_iteration && !is_persistent(tensors[t.id].kind) && !added.contains(t.id) && !holds_value(t.id)) {
    throw usage_error("read(\"" + tensors[t.id].name + "\"): a transient of an earlier iteration, whose value " +
                      "ended with it, and no op of this iteration has written it. Read it after an op of this " +
                      "iteration writes it (or, for a metric the earlier iteration did not release, after that " +
                      "iteration's end)");
  }
  const auto ids = pieces_of(t.id);
  for (auto id : ids) exec->check_readable(id);  // a released tensor, or one with no value, is an error naming it
  auto read_pieces = [&] {
    if (!is_split(t.id)) {
      exec->read(t.id, host);
      return;
    }
    for (const auto& pc : splits.at(t.id).pieces) exec->read(pc.id, static_cast<std::byte*>(host) + pc.offset);
  };
  if (!in_iteration) {
    check_sums("host read: " + tensors[t.id].name, ids, {}, {}, {});  // reads its pieces, as an op would
    read_pieces();
    return;
  }
  std::vector<tensor_handle> reads;  // the pieces, not the parent: nothing to gather
  for (auto id : ids) reads.push_back(tensor_handle{id});
  const auto k = open_op("host read: " + tensors[t.id].name, reads, {}, {}, 0, op_phase::other);
  try {
    read_pieces();
  } catch (...) {
    end_op(k);
    throw;
  }
  end_op(k);
} catch (...) {
  note_failure();
  throw;
}

// Note [Sums no op read]
// Note [Accumulation] zero-fills a tensor at its first accumulation in an iteration: the loop's
// "zero the gradients, then +=" within one step. A loop that makes each micro-batch an iteration
// and steps the optimizer every few of them (PyTorch's gradient accumulation, wrapped as it is)
// would then lose what the earlier micro-batches added, silently: each iteration's zero-fill
// discards the last one's sum, which nothing read. So the Session notes, per piece, a sum that no
// op or host read has read since it was added to (unread_sums), and counts the iterations whose
// such sum a zero-fill discarded since the piece was last read (lost_sums). An op or host read
// of the piece is a usage_error, before its work (the optimizer does not apply part of the
// gradient), that says how to keep the sum, when two or more iterations' sums were lost, or one
// was and the read before found a loss too (two micro-batches a step, met at its second step),
// or one was and the piece holds no value (a plan recorded from a micro-batch's iteration drops
// the gradient after its last accumulation, Note [Dropped gradients]). One lost sum alone is
// otherwise a step the loop skipped after its backward pass (a loss that was not finite), whose
// sum is rightly dropped, so it refuses nothing. Neither does a sum never read (a frozen
// layer's gradient); an op that overwrites the piece ends its sum; a failed step's sums go with it
// (forget_sums).
void session_impl::check_sums(const std::string& name, std::span<const tensor_id> consumed,
                              std::span<const tensor_id> zeroed, std::span<const tensor_id> overwritten,
                              std::span<const tensor_id> summed) {
  for (auto id : consumed) {
    const auto it = lost_sums.find(id);
    const int lost = it == lost_sums.end() ? 0 : it->second;
    if (lost < 1 || (lost < 2 && !lossy_reads.contains(id) && holds_value(id))) continue;
    const auto p = parent_of.find(id);
    const std::string& whole = tensors[p == parent_of.end() ? id : p->second].name;
    throw usage_error("op \"" + name + "\" reads \"" + whole + "\", whose sums from " +
                      (lost >= 2 ? std::to_string(lost) + " earlier iterations" : std::string("an earlier iteration")) +
                      " no op read before the next iteration's first accumulation zeroed them (Note [Accumulation]): " +
                      "what they added is lost. If each iteration is one micro-batch of a step, make one iteration " +
                      "of the whole step (every micro-batch, then the optimizer); or keep the sum across iterations " +
                      "yourself: list it in the ops' reads and writes instead of their accumulations. If each " +
                      "iteration's sum alone is meant, name it in the writes of its first op in the iteration, which " +
                      "overwrites what the last one left");
  }
  for (auto id : zeroed)
    if (unread_sums.erase(id) > 0) ++lost_sums[id];
  for (auto id : consumed) {
    if (lost_sums.erase(id) > 0) {
      lossy_reads.insert(id);
    } else {
      lossy_reads.erase(id);
    }
    unread_sums.erase(id);
  }
  for (auto id : overwritten) {
    unread_sums.erase(id);
    lost_sums.erase(id);
  }
  for (auto id : summed) unread_sums.insert(id);
}

// Note [Recomputable ops]
// Session::recomputable_op records an op the trace marks recomputable (op_desc::recomputable)
// and keeps its body, for this iteration, at the op's index. When the plan reruns op o before a
// later op (Note [Recomputation] in prefetch/plan.hpp), the executor makes o's tensors resident
// and calls back here: the body runs again with a scope over o's tensors as the trace records
// them, whose ptr() gives their device pointers now. Such a scope ends nothing when it goes. The
// rules for a body that a rerun may repeat (transient outputs only, none also read, no
// accumulation, no split parent to gather) are checked before the op's first run, so the trace
// that records it is always one the planner accepts.
void session_impl::check_recomputable(const std::string& name, std::span<const tensor_handle> reads,
                                      std::span<const tensor_handle> writes) const {
  const std::string who = "recomputable_op(\"" + name + "\")";
  for (auto t : writes) {
    check_handle(t);
    const auto& d = tensors[t.id];
    SPILLWAY_EXPECTS_T(usage_error, !is_persistent(d.kind),
                       who + ": writes " + std::string(to_string(d.kind)) + " \"" + d.name +
                           "\"; a recomputable op writes only transients (activations, workspaces, metrics): use op()");
    SPILLWAY_EXPECTS_T(usage_error, !names(reads, t.id),
                       who + ": reads and writes \"" + d.name +
                           "\" (in place); a rerun would not see the input it first had: write another tensor, or use op()");
  }
  for (auto t : reads) {
    check_handle(t);
    SPILLWAY_EXPECTS_T(usage_error, !is_split(t.id),
                       who + ": names \"" + tensors[t.id].name +
                           "\", which is split into views; a recomputable op names the views it reads");
  }
}

void session_impl::rerun(op_index o) {
  SPILLWAY_EXPECTS_T(usage_error, o < bodies.size() && bodies[o],
                     "the plan recomputes op " + std::to_string(o) +
                         (o < ops.size() ? " (\"" + ops[o].name + "\")" : std::string()) +
                         ", which this iteration did not give as a recomputable_op");
  std::vector<named_tensor> named;
  for (auto id : ops[o].reads) named.push_back(named_tensor{id, true, false, nullptr});
  for (auto id : ops[o].writes) named.push_back(named_tensor{id, false, true, nullptr});
  auto saved = std::move(open_named);
  const bool was_open = op_open;
  open_named = std::move(named);
  op_open = true;
  rerunning = o;
  auto restore = [&] {
    open_named = std::move(saved);
    op_open = was_open;
    rerunning.reset();
  };
  try {
    const Session::op_scope scope(this, static_cast<std::uint32_t>(o), /*rerun=*/true);
    bodies[o](scope);
    check_rerun(o);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

void Session::recomputable_op(std::string_view name, std::initializer_list<tensor_handle> reads,
                              std::initializer_list<tensor_handle> writes, const op_body& body, double flops) {
  recomputable_op(name, std::span<const tensor_handle>(reads.begin(), reads.size()),
                  std::span<const tensor_handle>(writes.begin(), writes.size()), body, flops);
}

void Session::recomputable_op(std::string_view name, std::span<const tensor_handle> reads,
                              std::span<const tensor_handle> writes, const op_body& body, double flops) {
  const std::string op_name(name);
  const session_detail::session_call claim(*impl_, "recomputable_op", op_name);
  SPILLWAY_EXPECTS_T(usage_error, static_cast<bool>(body), "recomputable_op(\"" + op_name + "\"): no body given");
  impl_->check_recomputable(op_name, reads, writes);
  const auto k = impl_->open_op(name, reads, writes, {}, flops, session_detail::phase_from_name(name), true);
  op_scope scope(impl_.get(), k);
  impl_->bodies.at(k) = body;
  body(scope);
  impl_->note_first_run(k);
}

}  // namespace spillway
