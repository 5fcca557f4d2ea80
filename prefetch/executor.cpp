// The executor's implementation. Note [Stream roles] says which stream does what; Note [Misses]
// how a plan that is wrong still gives correct results.
#include "prefetch/executor.hpp"
#include "prefetch/executor_state.hpp"

#include <algorithm>
#include <unordered_set>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway {

// Note [Stream roles]
// compute: the ops, in program order; frees of tensors whose last use is an op.
// h2d: copies tier -> device (prefetches and on-demand fetches); allocations for them are made
//      on h2d, and an op that reads the tensor waits on the load's device event, recorded right
//      after its H2D copy (for a load from NVMe, by the I/O thread once the read is verified:
//      move_handle::stream_wait waits on the host until then, never in a host function).
// d2h: copies device -> tier (swap-outs), each after the op_done event (recorded on compute
//      when an op's first swap-out needs it, so it covers every op enqueued before), and the
//      free of the device memory right behind the copy, in stream order.
// The memory resource hands a block freed on one stream to another only after an event shows
// the first stream is done with it, so these frees never race the copies.
//
// Note [Misses]
// The plan is an optimisation, never a condition for correctness. A tensor an op reads that is
// not resident is fetched on demand; an allocation past the budget evicts the resident tensor
// used farthest in the future (least recently used while recording), saving it first unless
// its tier copy is current; a "drop" of a tensor whose value is still needed becomes a save.
//
// Note [Transients live until release]
// A plan may say "drop" for a transient after its last use in the trace it was made from, but
// only the program knows when the value is dead: it says so with release() (or by ending the
// iteration). The loop may depart from the trace after that op (an evaluation iteration whose
// first ops have the training ops' names, a host read the trace did not have), and then the
// value is still needed. So a drop never discards a transient that holds the only copy of its
// value: the tensor stays resident until release() frees it, and when memory is short it is the
// first candidate for an on-demand eviction (its next use is beyond the trace), which saves it.
// Where a tier copy holds the value too (it was swapped out and back) and the last iteration
// released it right after this op, the tier copy goes at the drop instead, as the simulator
// counts the host tier: kept until release(), it would hold a block while the op's own copies
// out need the tier; the device copy is freed by the release a moment later, where the plan
// and its layout free it.
// In the usual loop release() follows the last use at once, so the memory is back where the
// plan expects it; make_layout (layout.cpp) mirrors this with the release points it is given.


// Note [The default stream]
// A loop ported to the Session launches its work on op.stream(), but code it did not write often
// launches on none: a kernel with no stream argument, a synchronous cudaMemcpy of the loss into a
// host variable, a library handle never given a stream. On CUDA that is the legacy default
// stream, which is ordered with every stream made without cudaStreamNonBlocking. So the compute
// stream is made ordered (default_stream_order::ordered): such work inside an op's scope runs
// after the fetches the op waits for and before the swap-outs behind it, and a host copy of the
// loss sees the value. The copy streams stay independent, so default-stream work never waits for
// a prefetch the op does not need. The library itself launches nothing on the default stream.

// Note [Timing events] is in executor_timing.cpp, Note [Failed loads] in executor_failures.cpp.

executor::executor(Device& device, arena_allocator& arena, tensor_backing& backing, executor_options options)
    : device_(&device),
      arena_(&arena),
      backing_(&backing),
      options_(options),
      compute_(device, stream_priority::normal, default_stream_order::ordered),  // Note [The default stream]
      h2d_(device, stream_priority::high),
      d2h_(device, stream_priority::low),
      op_done_(device),
      origin_(std::chrono::steady_clock::now()) {
  if (options_.spill_tier == tier::device) throw config_error("executor: the spill tier must be host or nvme, not device");
  if (options_.timeline) backing_->keep_io_spans(true);
}

executor::~executor() {
  try {
    device_->synchronize();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
  }
  try {
    backing_->drain();  // even after a device failure: no move may still use what is freed below
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
  }
  for (auto& t : tensors_) {
    if (t && t->dev != nullptr) arena_->deallocate(t->dev, t->desc.bytes, stream{});
  }
  for (auto& [p, bytes] : scratch_) arena_->deallocate(p, bytes, stream{});
  for (stream s : {compute_.get(), h2d_.get(), d2h_.get()}) {
    try {
      arena_->forget_stream(s);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
  }
}

executor::tensor_state& executor::state(tensor_id id) {
  SPILLWAY_EXPECTS_T(usage_error, id < tensors_.size() && tensors_[id] && tensors_[id]->defined,
                     "executor: tensor " + std::to_string(id) + " was never defined");
  return *tensors_[id];
}

void executor::define(tensor_id id, const tensor_desc& desc) {
  if (id >= tensors_.size()) tensors_.resize(id + 1);
  auto& slot = tensors_[id];
  if (slot && slot->defined) {
    if (slot->desc.bytes != desc.bytes) {
      throw config_error("executor: tensor \"" + desc.name + "\" redefined with " + std::to_string(desc.bytes) +
                         " bytes; it has " + std::to_string(slot->desc.bytes));
    }
    slot->released = false;
    return;
  }
  if (desc.bytes == 0) throw config_error("executor: tensor \"" + desc.name + "\" has 0 bytes; give it at least 1");
  slot = std::make_unique<tensor_state>();
  slot->desc = desc;
  slot->defined = true;
  slot->ready = std::make_unique<owned_event>(*device_);
}

void executor::upload(tensor_id id, const void* host, tier where) {
  auto& st = state(id);
  // Stored first: a put that fails leaves the tensor its value, on the device or in the tier.
  backing_->put(id, st.desc.name, host, st.desc.bytes, where == tier::device ? tier::host : where);
  if (st.dev != nullptr) drop_device(id);
  st.tier_current = true;
  ++st.version;
  st.awaiting_rerun = false;
}

void executor::check_readable(tensor_id id) {
  auto& st = state(id);
  SPILLWAY_EXPECTS_T(usage_error, !st.released,
                     "executor: read of tensor \"" + st.desc.name +
                         "\", which the program released in this iteration; read it before release()");
  // A value dropped for a recomputation is remade by the rerun the plan puts before the read's
  // op; begin_op says so, naming the tensor, when no rerun did (Note [Drops for recomputation]).
  if (st.awaiting_rerun && in_iteration_ && st.dev == nullptr) return;
  if ((st.dev == nullptr || !st.dev_valid) && !st.tier_current) throw_no_value(st, "a host read of");
}

// Note [Dropped gradients]
// A gradient the recorded step overwrites before it reads it again (zero-filled by its first
// accumulation, or written whole by the backward pass) is dead after its last read in the step
// (the optimizer's), and plans drop it there instead of copying it out. A value no op has read
// since it was written is never dead (value_dead_after). A read the recorded step does not make (a
// log of its norm every hundred steps, a read after end_iteration) then finds no value, and the
// error says how to get one: make the read where a plan sees it (every step, or the steps that
// read under their own tag, planned with the read), or keep the value in optimizer state.
void executor::throw_no_value(const tensor_state& st, const std::string& reader) {
  if (st.desc.kind == tensor_kind::gradient)
    throw usage_error("executor: " + reader + " gradient \"" + st.desc.name +
                      "\", whose value the plan dropped after its last read in the step: the recorded step "
                      "overwrites it before reading it again, so nothing kept it. Make the read one the plan was made "
                      "with: read it inside the step (before end_iteration()) in every step, or in the steps that "
                      "read it under their own tag (begin_iteration(\"log\")); or keep a value that must outlive the "
                      "step in an optimizer_state tensor (Note [Dropped gradients] in prefetch/executor.cpp)");
  throw usage_error("executor: " + reader + " tensor \"" + st.desc.name +
                    "\", which holds no value: no op of this iteration has written it yet (a transient's value "
                    "lasts from its first write to its release() or the end of the iteration). A value one iteration "
                    "hands to the next (a recurrent state, a cache) belongs in a persistent tensor: add_persistent, "
                    "of kind optimizer_state, whose value no plan drops");
}

void executor::read(tensor_id id, void* host) {
  check_readable(id);
  auto& st = state(id);
  if (st.awaiting_rerun && st.dev == nullptr && !st.tier_current) throw_awaiting_rerun(st, "a host read");
  (void)forget_failed_load(id);  // then the tier copy is read (Note [Failed loads])
  if (st.dev != nullptr && st.dev_valid) {
    if (st.ready_pending) wait_landed(compute_, st);
    device_->copy_async(host, st.dev, st.desc.bytes, copy_kind::device_to_host, compute_);
    op_done_current_ = false;
    device_->synchronize_stream(compute_);
    return;
  }
  try {  // a failed save kept the bytes where they were; its op or iteration reports the error
    if (st.pending_save.valid()) st.pending_save.wait();
  } catch (const io_error&) {  // NOLINT(bugprone-empty-catch)
  }
  backing_->get(id, st.desc.name, host, st.desc.bytes);
}

void executor::follow(const trace* t, const plan* p, const device_layout* layout) {
  next_trace_ = t;
  next_plan_ = p;
  next_layout_.reset();
  if (layout != nullptr) next_layout_ = *layout;
  follow_pending_ = true;
}

void executor::wait_landed(stream s, tensor_state& st) {
  if (st.pending_load.valid() && st.pending_load.has_device_event()) {
    st.pending_load.stream_wait(*device_, s);
  } else {
    device_->stream_wait_event(s, *st.ready);
  }
}

bool executor::landed(tensor_state& st) {
  if (st.pending_load.valid() && st.pending_load.has_device_event()) return st.pending_load.ready();
  return device_->query_event(*st.ready);
}

void executor::note_scratch() {
  std::uint64_t held = 0;
  for (const auto& sc : scratch_) held += device_budget::placed(sc.second);
  stats_.op_scratch_peak_bytes = std::max(stats_.op_scratch_peak_bytes, held);
}

void executor::note_memory() {
  peak_ = std::max(peak_, in_use_);
  if (options_.timeline) memory_samples_.push_back(memory_sample{now_us(), in_use_});
}

void executor::synchronize_streams() {
  device_->synchronize_stream(d2h_);
  device_->synchronize_stream(compute_);
  device_->synchronize_stream(h2d_);
}

bool executor::fetch(tensor_id id, bool on_demand) {
  auto& st = state(id);
  if (st.dev != nullptr) return true;
  if (st.awaiting_rerun && !st.tier_current) {
    if (!on_demand) return false;  // a prefetch: the op that reads it reports the error
    throw_awaiting_rerun(st, "op " + std::to_string(current_op_) + " (\"" + current_name_ + "\")");
  }
  if (!st.tier_current) throw_no_value(st, "op " + std::to_string(current_op_) + " (\"" + current_name_ + "\") reads");
  void* dev = allocate_for(id, h2d_, /*may_evict=*/on_demand);
  if (dev == nullptr) return false;  // a prefetch that does not fit now; fetched on demand later
  const auto where = backing_->where(id);
  const bool from_nvme = where.has_value() && *where == tier::nvme;
  try {
    // The load reads the tier copy a save may still be writing: a device-side wait for a save to
    // the host tier, a wait here for one that ends in file I/O (move_handle::stream_wait).
    if (st.pending_save.valid() && !st.pending_save.ready()) st.pending_save.stream_wait(*device_, h2d_);
    // A load from NVMe enqueues its H2D copy when the read completes, so stamps around load()
    // would not bracket it: the backing times that copy itself (take_copy_spans).
    timeline_item* item =
        options_.timeline && !from_nvme ? stamp_start(h2d_, timeline_item::track::h2d, st.desc.name) : nullptr;
    st.pending_load = backing_->load(id, st.desc.name, dev, st.desc.bytes, h2d_);
    stamp_end(h2d_, item);
    // A handle without a device event: its copy was enqueued on h2d by load() itself.
    if (!st.pending_load.has_device_event()) device_->record_event(*st.ready, h2d_);
  } catch (...) {
    // The device refused part of the load: the memory goes back (in h2d's order, after any copy
    // into it that was enqueued); the tier copy stays the tensor's value. A load already issued
    // (a refusal after it) may land later, from an I/O thread: it ends before its memory goes.
    if (st.pending_load.valid()) {
      try {
        st.pending_load.wait();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the refusal is the error reported
      }
    }
    st.pending_load = move_handle{};
    st.dev = dev;
    free_device(st, h2d_);
    throw;
  }
  st.ready_pending = true;
  st.dev = dev;
  st.dev_valid = true;
  st.loaded_from_nvme = from_nvme;
  if (on_demand) ++stats_.on_demand_fetches;
  return true;
}

void executor::drop_device(tensor_id id) {
  auto& st = state(id);
  if (st.dev == nullptr) return;
  if (st.ready_pending) {
    wait_landed(compute_, st);  // the load lands before the memory is reused
    st.ready_pending = false;
  }
  free_device(st, compute_);
}

void executor::free_device(tensor_state& st, stream s) {
  arena_->deallocate(st.dev, st.desc.bytes, s);
  in_use_ -= st.desc.bytes;
  st.dev = nullptr;
  st.dev_valid = false;
  note_memory();
}

void executor::evict(tensor_id id, tier to, bool on_demand, std::span<const tensor_id> keep) {
  auto& st = state(id);
  if (st.dev == nullptr) return;
  if (on_demand) ++stats_.on_demand_evictions;
  if (!st.dev_valid || st.tier_current) {
    drop_device(id);
    return;
  }
  // After the work enqueued on compute so far, which covers the tensor's last use: one event
  // per op at most, recorded when the op's first eviction needs it (Note [Stream roles]).
  if (!op_done_current_) {
    device_->record_event(op_done_, compute_);
    op_done_current_ = true;
    d2h_waits_op_done_ = false;
  }
  if (!d2h_waits_op_done_) {
    device_->stream_wait_event(d2h_, op_done_);
    d2h_waits_op_done_ = true;
  }
  if (st.ready_pending) wait_landed(d2h_, st);  // the copy out reads what a load still in flight writes
  timeline_item* item = options_.timeline ? stamp_start(d2h_, timeline_item::track::d2h, st.desc.name) : nullptr;
  const auto kept = keep.empty() ? std::span<const tensor_id>(&id, 1) : keep;
  st.pending_save =
      with_tier_room(kept, [&] { return backing_->save(id, st.desc.name, st.dev, st.desc.bytes, to, d2h_); });
  stamp_end(d2h_, item);
  st.tier_current = true;
  free_device(st, d2h_);
}

// Note [Redundant tier copies]
// A load keeps the tier copy, so that a tensor that leaves the device again unchanged needs no
// copy out. While the device holds the same value that copy is redundant, and the simulator
// does not count it: a plan starts a tensor whose initial tier is the device with no tier copy,
// so the host tier a plan is judged to fit (Note [Sizing the host tier] in offload/session.cpp)
// leaves no room for such copies. When the tier is full, the executor lets them go, every copy
// of a tensor whose device copy is valid, and tries once more; a later eviction of those
// tensors then copies out again.
std::size_t executor::free_redundant_copies(std::span<const tensor_id> keep) {
  std::size_t freed = 0;
  for (tensor_id id = 0; id < tensors_.size(); ++id) {
    auto& t = tensors_[id];
    if (!t || !t->tier_current) continue;
    // A load still on the link: the device does not hold the value yet, so the tier copy is its
    // only one (a copy out now would read bytes the load has not written).
    const bool on_device = t->dev != nullptr && t->dev_valid && (!t->ready_pending || landed(*t));
    // A gradient only in the tier whose value the trace overwrites before reading it again: dead
    // (value_dead_after's rule), so its copy goes too. Judged after the op that has run last:
    // the open one once it has ended, else the one before it.
    const bool dead = t->dev == nullptr && t->desc.kind == tensor_kind::gradient &&
                      (op_ended_             ? value_dead_after(id, current_op_)
                       : current_op_ == 0    ? value_dead_before_first_use(id)
                                             : value_dead_after(id, current_op_ - 1));
    if (!on_device && !dead) continue;
    if (std::find(keep.begin(), keep.end(), id) != keep.end() || backing_->where(id) != tier::host) continue;
    backing_->discard(id);
    t->tier_current = false;
    ++freed;
  }
  return freed;
}

void executor::begin_iteration() {
  SPILLWAY_EXPECTS_T(usage_error, !in_iteration_, "executor: begin_iteration twice without end_iteration");
  in_iteration_ = true;
  const bool new_plan = next_plan_ != plan_ || next_trace_ != trace_ || follow_pending_;
  follow_pending_ = false;
  if (new_plan) {
    plan_ = next_plan_;
    trace_ = next_trace_;
    uses_.assign(tensors_.size(), {});
    if (trace_ != nullptr) {
      uses_.resize(std::max(tensors_.size(), trace_->tensors.size()));
      for (op_index k = 0; k < trace_->ops.size(); ++k) {
        for (auto t : trace_->ops[k].reads) uses_[t].push_back(k);
        for (auto t : trace_->ops[k].writes) uses_[t].push_back(k);
      }
      for (auto& u : uses_) {
        std::sort(u.begin(), u.end());
        u.erase(std::unique(u.begin(), u.end()), u.end());
      }
    }
    reruns_ = plan_ != nullptr && trace_ != nullptr ? rerun_index(*trace_, *plan_) : rerun_index{};
  }
  ran_.clear();
  ran_readers_.clear();
  stats_ = executor_stats{};
  probes_.clear();
  stamps_.clear();
  timing_used_ = 0;  // the last iteration's events were all read (Note [Timing events])
  origin_us_ = now_us();
  origin_event_ = mark_time(compute_);
  origin_h2d_ = mark_time(h2d_);
  origin_d2h_ = mark_time(d2h_);
  host_stall_ms_ = 0;
  counters_at_start_ = backing_->counters();
  peak_ = in_use_;
  iteration_start_ = std::chrono::steady_clock::now();
  current_op_ = 0;
  op_ended_ = false;
  for (auto& t : tensors_) {
    if (!t) continue;
    t->released = false;
    t->awaiting_rerun = false;
    t->rerun_temp = false;
  }
  rerun_temps_.clear();
  op_items_.clear();

  if (new_plan) adopt_layout();
  stats_.layout = layout_.has_value();
  alloc_slot_ = layout_slot::start_fetch;

  // Start where the plan starts: persistent tensors in their initial tier.
  if (plan_ != nullptr) {
    for (tensor_id id = 0; id < tensors_.size() && id < plan_->initial_tier.size(); ++id) {
      auto& t = tensors_[id];
      if (!t || !is_persistent(t->desc.kind)) continue;
      const tier want = plan_->initial_tier[id];
      if (want != tier::device && t->dev != nullptr) evict(id, want, false);
    }
    for (tensor_id id = 0; id < tensors_.size() && id < plan_->initial_tier.size(); ++id) {
      auto& t = tensors_[id];
      if (!t || !is_persistent(t->desc.kind) || plan_->initial_tier[id] != tier::device || t->dev != nullptr) continue;
      if (!t->tier_current || !budget().admits(in_use_, t->desc.bytes)) continue;
      fetch(id, false);
    }
  }
}

void executor::adopt_layout() {
  layout_.reset();
  std::optional<device_layout> given = std::move(next_layout_);
  next_layout_.reset();
  if (plan_ == nullptr || trace_ == nullptr) return;
  auto l = given ? std::move(*given) : make_layout(*trace_, *plan_, released_after_);

  if (!budget().admits(0, l.extent) || l.extent > arena_->capacity()) return;  // best fit, as without a plan
  layout_ = std::move(l);
  // What is on the device now sits where best fit put it. A tensor not at the address the
  // layout starts it at leaves (a copy-out if its tier copy is stale) and comes back there.
  for (tensor_id id = 0; id < tensors_.size(); ++id) {
    auto& t = tensors_[id];
    if (!t || t->dev == nullptr) continue;
    const auto at = layout_->offset(id, layout_slot::start_fetch);
    if (!at || arena_->offset_of(t->dev) != *at) evict(id, options_.spill_tier, false);
  }
}

void executor::begin_op(op_index k, std::span<const tensor_id> reads, std::span<const tensor_id> writes,
                        const std::string& name) {
  (void)begin_op(k, reads, writes, name, {});
}

std::vector<void*> executor::begin_op(op_index k, std::span<const tensor_id> reads, std::span<const tensor_id> writes,
                                      const std::string& name, std::span<const std::uint64_t> scratch) {
  for (auto b : scratch)
    if (b == 0) throw config_error("executor: op \"" + name + "\" asks for scratch of 0 bytes; ask for at least 1");
  SPILLWAY_EXPECTS_T(usage_error, in_iteration_, "executor: an op outside begin_iteration/end_iteration");
  SPILLWAY_EXPECTS_T(usage_error, !op_open_, "executor: begin_op inside another op (end_op first)");
  current_op_ = k;
  op_ended_ = false;
  current_name_ = name;
  ++clock_;
  pinned_.assign(reads.begin(), reads.end());
  pinned_.insert(pinned_.end(), writes.begin(), writes.end());
  writes_.assign(writes.begin(), writes.end());
  for (auto id : pinned_) {
    auto& st = state(id);
    st.last_used = clock_;
    SPILLWAY_EXPECTS_T(usage_error, !st.released,
                       "executor: op \"" + name + "\" uses tensor \"" + st.desc.name + "\" after release()");
  }

  // The plan's prefetches for this op (and later ones). Never evict for them: a prefetch that
  // does not fit is left to be fetched on demand.
  // A plan that runs op k on the host, followed by an owner that runs it on the device, no longer
  // describes the iteration (Note [Host ops in the executor]).
  if (placed_on_host(k)) abandon_plan();
  issue_prefetches(k);
  if (plan_ != nullptr && k < plan_->steps.size() && !plan_->steps[k].recomputes.empty()) run_recomputes(k);
  if (plan_ == nullptr) run_reruns_on_demand(k, reads, writes);  // the iteration departed from the plan
  wait_if_synchronous(k);

  alloc_slot_ = layout_slot::place(k);
  const std::size_t first_scratch = scratch_.size();
  try {
    place_op_tensors(reads, writes, scratch);
    check_loads(reads);
    note_op_inputs(k, reads);
    wait_pinned();
    open_op_ = (options_.timeline || timing_) ? stamp_start(compute_, timeline_item::track::compute, name) : nullptr;
  } catch (...) {
    free_scratch();  // the op never opened: its scratch goes back now
    throw;
  }
  op_open_ = true;
  note_scratch();
  std::vector<void*> out;
  for (std::size_t i = first_scratch; i < scratch_.size(); ++i) out.push_back(scratch_[i].first);
  return out;
}

void executor::issue_prefetches(op_index k) {
  alloc_slot_ = layout_slot::prefetch(k);
  if (plan_ == nullptr || k >= plan_->steps.size()) return;
  for (const auto& p : plan_->steps[k].prefetches) {
    if (p.tensor >= tensors_.size() || !tensors_[p.tensor]) continue;
    auto& st = *tensors_[p.tensor];
    if (st.dev != nullptr || !st.tier_current || (st.released && !st.rerun_temp)) continue;
    if (!budget().admits(in_use_, st.desc.bytes) || !fetch(p.tensor, false)) ++stats_.prefetches_deferred;
  }
}

void executor::wait_if_synchronous(op_index k) {
  if (plan_ == nullptr || k >= plan_->steps.size() || !plan_->steps[k].synchronous) return;
  const auto t0 = std::chrono::steady_clock::now();
  synchronize_streams();
  backing_->drain();
  host_stall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void executor::wait_pinned() {
  std::vector<std::string> waiting;
  std::vector<tensor_id> to_wait;
  for (auto id : pinned_) {
    auto& st = state(id);
    if (!st.ready_pending) continue;
    if (std::find(to_wait.begin(), to_wait.end(), id) != to_wait.end()) continue;
    to_wait.push_back(id);
    if (!landed(st)) waiting.push_back(st.desc.name);
  }
  probe* p = nullptr;
  if (!waiting.empty()) {  // how long compute waits for them: Note [Timing events]
    probes_.push_back(probe{std::move(waiting), mark_time(compute_), {}});
    p = &probes_.back();
  }
  try {
    for (auto id : to_wait) {
      auto& st = state(id);
      wait_landed(compute_, st);
      st.ready_pending = false;
    }
    if (p != nullptr) p->end = mark_time(compute_);
  } catch (...) {
    if (p != nullptr) probes_.pop_back();  // a probe without its end measures nothing
    throw;
  }
}

void* executor::scratch(std::uint64_t bytes) {
  SPILLWAY_EXPECTS_T(usage_error, op_open_, "executor: scratch of " + format_bytes(bytes) + " outside an op");
  if (bytes == 0) throw config_error("executor: scratch of 0 bytes; ask for at least 1");
  // Past 1 PiB the sums of the budget's checks wrap, and the error would name a wrong remedy (a
  // failed size query's -1 passed on as a size, say).
  if (bytes > max_size_bytes)
    throw config_error("executor: scratch of " + std::to_string(bytes) + " bytes; at most 1 PiB is possible (" +
                       std::to_string(max_size_bytes) + " bytes)");
  // Ordered on compute after the op's waits, like the op's own work; freed there when it ends.
  void* p = allocate_bytes(bytes, compute_, /*may_evict=*/true, nullptr);
  scratch_.emplace_back(p, bytes);
  note_scratch();
  return p;
}

void executor::leave_device() {
  SPILLWAY_EXPECTS_T(usage_error, !in_iteration_, "executor: leave_device() inside an iteration");
  for (tensor_id id = 0; id < tensors_.size(); ++id) {
    auto& t = tensors_[id];
    if (!t || t->dev == nullptr) continue;
    const bool planned = plan_ != nullptr && id < plan_->initial_tier.size() && plan_->initial_tier[id] != tier::device;
    evict(id, planned ? plan_->initial_tier[id] : options_.spill_tier, false);
  }
  synchronize_streams();
  backing_->drain();
  rethrow_move_errors();
  for (auto& t : tensors_)
    if (t) t->ready_pending = false;
}

void executor::end_op(op_index k) {
  timeline_item* const item = std::exchange(open_op_, nullptr);
  op_done_current_ = false;  // the op's work is enqueued: op_done_ no longer covers it
  op_open_ = false;
  op_ended_ = true;
  // The op ends whatever the device says to its end stamp: its work is enqueued, and what it
  // wrote is the tensors' value. A stamp the device refuses is reported once the op has ended.
  std::exception_ptr stamp_failure;
  try {
    stamp_end(compute_, item);
    if (item != nullptr) op_items_.emplace_back(k, item);
  } catch (...) {
    stamp_failure = std::current_exception();
  }
  free_scratch();
  // What the op wrote is now only on the device: its tier copy, if any, is stale.
  for (auto id : writes_) {
    auto& st = state(id);
    st.dev_valid = true;
    if (st.tier_current) backing_->discard(id);  // its block goes back to the tier now
    st.tier_current = false;
    st.awaiting_rerun = false;
    ++st.version;
  }
  note_op_outputs(k);
  apply_evictions(k);
  free_rerun_temps(k);
  pinned_.clear();
  writes_.clear();
  if (stamp_failure) std::rethrow_exception(stamp_failure);
}

void executor::apply_evictions(op_index k) {
  if (plan_ == nullptr || k >= plan_->steps.size()) return;
  for (const auto& e : plan_->steps[k].evictions) {
    if (e.tensor >= tensors_.size() || !tensors_[e.tensor]) continue;
    auto& st = *tensors_[e.tensor];
    if (st.dev == nullptr) continue;
    switch (e.action) {
      case evict_action::evict_to_host: evict(e.tensor, tier::host, false); break;
      case evict_action::evict_to_nvme: evict(e.tensor, tier::nvme, false); break;
      case evict_action::drop:
        // Note [Transients live until release]
        if (st.tier_current && st.dev_valid && !is_persistent(st.desc.kind) && value_dead_after(e.tensor, k) &&
            e.tensor < released_after_.size() && released_after_[e.tensor] == static_cast<std::int64_t>(k) &&
            !reruns_.drop_awaits_rerun(e.tensor, k)) {
          // Two copies of a value the trace never reads again, which the program released right
          // after this op last time: the device copy stays until release(), a moment away, and
          // the tier copy goes now, before this op's copies out need the tier.
          backing_->discard(e.tensor);
          st.tier_current = false;
        } else if (st.tier_current || !st.dev_valid) {
          drop_device(e.tensor);
        } else if (is_persistent(st.desc.kind)) {
          if (value_dead_after(e.tensor, k)) {
            drop_device(e.tensor);
          } else {
            evict(e.tensor, options_.spill_tier, false);  // the plan was wrong: keep the value
          }
        } else if (reruns_.drop_awaits_rerun(e.tensor, k)) {  // Note [Drops for recomputation]
          drop_device(e.tensor);
          st.awaiting_rerun = true;
        }
        break;
    }
  }
}

void executor::free_scratch() {
  for (auto& [p, bytes] : scratch_) {  // after the op's work, in compute's order
    arena_->deallocate(p, bytes, compute_);
    in_use_ -= bytes;
  }
  if (!scratch_.empty()) note_memory();
  scratch_.clear();
}

void executor::release(tensor_id id) {
  auto& st = state(id);
  SPILLWAY_EXPECTS_T(usage_error, !is_persistent(st.desc.kind),
                     "executor: release() of persistent tensor \"" + st.desc.name + "\"; only transients are released");
  if (in_iteration_) {
    if (released_after_.size() <= id) released_after_.resize(id + 1, -1);
    released_after_[id] = static_cast<std::int64_t>(current_op_);
  }
  retire(id);
  st.released = true;
}

void executor::retire(tensor_id id) {
  auto& st = state(id);
  drop_device(id);
  if (st.tier_current || st.pending_save.valid()) backing_->discard(id);
  st.pending_save = {};
  st.pending_load = {};
  st.tier_current = false;
  st.awaiting_rerun = false;
}

void executor::forget(tensor_id id) {
  retire(id);
  tensors_[id].reset();
}

executor_stats executor::end_iteration() {
  SPILLWAY_EXPECTS_T(usage_error, in_iteration_, "executor: end_iteration without begin_iteration");
  SPILLWAY_EXPECTS_T(usage_error, !op_open_, "executor: end_iteration inside an op (end_op first)");
  // The iteration ends here even when what follows throws (a device that failed): the owner
  // reports the error and may begin another, which meets the same error at its first use.
  struct ends_iteration {
    bool& in;
    ~ends_iteration() { in = false; }
  } ends{in_iteration_};
  // What reruns made for a later step that the iteration did not reach (the loop ended it early)
  // goes with the iteration, as the transients do.
  for (auto id : std::exchange(rerun_temps_, {})) {
    state(id).rerun_temp = false;
    retire(id);
  }
  for (tensor_id id = 0; id < tensors_.size(); ++id) {
    auto& t = tensors_[id];
    if (t && !is_persistent(t->desc.kind) && !t->released && (t->dev != nullptr || t->tier_current)) release(id);
  }
  if (plan_ != nullptr) {
    for (tensor_id id = 0; id < tensors_.size() && id < plan_->initial_tier.size(); ++id) {
      auto& t = tensors_[id];
      if (t && is_persistent(t->desc.kind) && plan_->initial_tier[id] != tier::device && t->dev != nullptr)
        evict(id, plan_->initial_tier[id], false);
    }
  }
  synchronize_streams();
  backing_->drain();
  for (auto& t : tensors_)
    if (t) t->ready_pending = false;

  stats_.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - iteration_start_).count();
  stats_.stall_ms = host_stall_ms_;
  read_stamps();
  for (const auto& p : probes_) {
    const double ms = std::max(0.0, device_->elapsed_ms(p.start, p.end));
    stats_.stall_ms += ms;
    for (const auto& name : p.tensors) stats_.stalls.emplace_back(name, ms / static_cast<double>(p.tensors.size()));
  }
  for (const auto& [k, item] : op_items_) {
    if (stats_.op_ms.size() <= k) stats_.op_ms.resize(k + 1, -1.0);
    stats_.op_ms[k] = std::max(0.0, (item->end_us - item->start_us) / 1000.0);
  }
  op_items_.clear();
  const auto c = backing_->counters();
  stats_.h2d_bytes = c.h2d_bytes - counters_at_start_.h2d_bytes;
  stats_.d2h_bytes = c.d2h_bytes - counters_at_start_.d2h_bytes;
  stats_.nvme_read_bytes = c.nvme_read_bytes - counters_at_start_.nvme_read_bytes;
  stats_.nvme_write_bytes = c.nvme_write_bytes - counters_at_start_.nvme_write_bytes;
  stats_.peak_device_bytes = peak_;
  if (options_.timeline) {
    for (auto& c : backing_->take_copy_spans()) {
      // Recorded on h2d_, where the executor's loads go (fetch).
      auto us = [&](const owned_event& e) { return origin_us_ + device_->elapsed_ms(origin_h2d_, e) * 1000.0; };
      timeline_.push_back(timeline_item{timeline_item::track::h2d, std::move(c.name), us(*c.start), us(*c.end)});
    }
    for (auto& io : backing_->take_io_spans()) {
      auto us = [&](std::chrono::steady_clock::time_point t) { return std::chrono::duration<double, std::micro>(t - origin_).count(); };
      timeline_.push_back(timeline_item{io.write ? timeline_item::track::nvme_write : timeline_item::track::nvme_read,
                                        std::move(io.name), us(io.start), us(io.end)});
    }
  } else {
    timeline_.clear();
  }
  rethrow_move_errors();
  return stats_;
}

void* executor::device_ptr(tensor_id id) const {
  SPILLWAY_EXPECTS_T(usage_error, id < tensors_.size() && tensors_[id], "executor: unknown tensor " + std::to_string(id));
  const auto& st = *tensors_[id];
  SPILLWAY_EXPECTS_T(usage_error, st.dev != nullptr,
                     "executor: tensor \"" + st.desc.name + "\" is not resident outside its op");
  return st.dev;
}

}  // namespace spillway
