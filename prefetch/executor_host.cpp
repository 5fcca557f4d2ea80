// The executor's ops on the host: Note [Host ops in the executor].
#include <algorithm>

#include "device/error.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_state.hpp"

namespace spillway {

// Note [Host ops in the executor]
// A plan may place an op on the host (Note [Host ops] in prefetch/plan.hpp). The executor runs
// such an op on the thread that issues the iteration, between device work:
//  * begin_host_op issues the plan's prefetches for the step (they serve later device ops) and
//    runs its recomputations, then waits, on this thread, until each tensor the op names has a
//    current host-tier copy that no move still uses: a value that is only on the device is
//    copied out first (a miss: the plan should have copied it out after its last device use),
//    a copy out in flight (the gradient the backward pass just wrote) or a load in flight of a
//    tensor the op writes (the old weights going up) ends first, and a copy on NVMe is read
//    into the host tier (tensor_backing::host_copy). Device copies of what the op writes are
//    dropped, freed in compute's order, so device work enqueued before still reads them.
//  * the owner runs the op's host code over the returned host pointers, on this thread, while
//    the device works through what was enqueued before; nothing is enqueued for the op itself.
//  * end_host_op marks what it wrote current in the host tier only and applies the plan's
//    evictions. Device work that follows is enqueued only after the host op has finished, so a
//    load of what it wrote (the new 16-bit weights, by a later prefetch) copies the new bytes.
// So host work is ordered against device work by events in one direction (the host waits for
// the copies it needs) and by program order in the other (the host enqueues what follows once
// it is done): no device stream ever waits on the host, and no host function blocks.
// A synchronous step (plan_step::synchronous) first waits for everything issued before it.
// An owner that runs a step the plan places on the host on the device instead (begin_op) leaves
// the plan: the iteration finishes on demand, with the same results (Note [Misses]).

bool executor::placed_on_host(op_index k) const noexcept {
  return plan_ != nullptr && k < plan_->steps.size() && plan_->steps[k].on_host;
}

std::vector<void*> executor::begin_host_op(op_index k, std::span<const tensor_id> reads,
                                           std::span<const tensor_id> writes, const std::string& name) {
  SPILLWAY_EXPECTS_T(usage_error, in_iteration_, "executor: host op \"" + name + "\" outside begin_iteration/end_iteration");
  SPILLWAY_EXPECTS_T(usage_error, !op_open_, "executor: host op \"" + name + "\" inside another op (end it first)");
  current_op_ = k;
  op_ended_ = false;
  current_name_ = name;
  ++clock_;
  writes_.assign(writes.begin(), writes.end());
  pinned_.clear();
  for (auto ids : {reads, writes}) {
    for (auto id : ids) {
      auto& st = state(id);
      st.last_used = clock_;
      SPILLWAY_EXPECTS_T(usage_error, !st.released,
                         "executor: host op \"" + name + "\" uses tensor \"" + st.desc.name + "\" after release()");
    }
  }
  issue_prefetches(k);
  if (plan_ != nullptr && k < plan_->steps.size() && !plan_->steps[k].recomputes.empty()) run_recomputes(k);
  wait_if_synchronous(k);
  const auto t0 = std::chrono::steady_clock::now();

  std::vector<tensor_id> mine(reads.begin(), reads.end());  // their tier copies are the op's: kept
  mine.insert(mine.end(), writes.begin(), writes.end());
  // Values the op reads that are only on the device go to the host tier first.
  for (auto id : reads) {
    auto& st = state(id);
    if (st.tier_current) continue;
    if (st.dev != nullptr && st.dev_valid) {
      evict(id, tier::host, /*on_demand=*/true, mine);
      continue;
    }
    if (st.awaiting_rerun) throw_awaiting_rerun(st, "host op " + std::to_string(k) + " (\"" + name + "\")");
    throw_no_value(st, "host op " + std::to_string(k) + " (\"" + name + "\") reads");
  }
  // Device copies of what it writes are stale from now on.
  for (auto id : writes) {
    auto& st = state(id);
    if (st.dev == nullptr) continue;
    const bool read_too = std::find(reads.begin(), reads.end(), id) != reads.end();
    if (!read_too && st.dev_valid && !st.tier_current) st.dev_valid = false;  // overwritten whole: no copy out
    drop_device(id);
  }
  std::vector<void*> out;
  out.reserve(reads.size() + writes.size());
  for (auto ids : {reads, writes}) {
    for (auto id : ids) {
      auto& st = state(id);
      // Waits for its moves.
      out.push_back(with_tier_room(mine, [&] { return backing_->host_copy(id, st.desc.name, st.desc.bytes); }));
    }
  }
  stats_.host_op_wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  host_op_start_us_ = now_us();
  op_open_ = true;
  host_op_open_ = true;
  return out;
}

void executor::end_host_op(op_index k) {
  SPILLWAY_EXPECTS_T(usage_error, host_op_open_, "executor: end_host_op without begin_host_op");
  const double end_us = now_us();
  op_open_ = false;
  host_op_open_ = false;
  op_ended_ = true;
  ++stats_.host_ops;
  stats_.host_op_ms += (end_us - host_op_start_us_) / 1000.0;
  if (options_.timeline)
    timeline_.push_back(timeline_item{timeline_item::track::host, current_name_, host_op_start_us_, end_us});
  for (auto id : writes_) {
    auto& st = state(id);
    st.tier_current = true;
    st.dev_valid = false;
    st.awaiting_rerun = false;
    ++st.version;
  }
  apply_evictions(k);
  free_rerun_temps(k);
  pinned_.clear();
  writes_.clear();
}

}  // namespace spillway
