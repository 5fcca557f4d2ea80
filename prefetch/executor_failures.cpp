// The executor's failed moves (Note [Failed loads]): loads from NVMe checked before an op reads
// them, the device copies of failed loads given up for the tier copies, the errors of an
// iteration's moves reported when it ends, and ops that an exception left (Note [Abandoned ops]).
#include <exception>
#include <utility>

#include "prefetch/executor.hpp"
#include "prefetch/executor_state.hpp"

namespace spillway {

// Note [Failed loads]
// A load from NVMe whose read fails copies nothing: the device memory it took holds no value,
// and the tier copy, which the failed read left as it was, stays the tensor's value. So the
// device copy goes at once, wherever the failure is found (forget_failed_load): before an op
// (check_loads), before a host read (which then reads the tier copy), and when an iteration's
// errors are reported (rethrow_move_errors). Before an op, the failure ends the iteration, so
// every other NVMe load still in flight is waited for and forgotten too if it failed: none is
// left to stand for its value, or to report its error later, when the drive may be answering
// again and a read of that tensor would succeed.

bool executor::forget_failed_load(tensor_id id) {
  auto& st = state(id);
  if (!st.pending_load.valid()) return false;
  if (st.loaded_from_nvme) {
    try {
      st.pending_load.wait_enqueued();
    } catch (...) {  // NOLINT(bugprone-empty-catch): error() says so below; the caller reports it
    }
  }
  if (!st.pending_load.error()) return false;
  st.pending_load = {};
  st.loaded_from_nvme = false;
  device_->synchronize_stream(h2d_);
  st.ready_pending = false;
  drop_device(id);  // the tier copy stays: nothing is lost
  return true;
}

void executor::forget_failed_loads() {
  for (tensor_id id = 0; id < tensors_.size(); ++id)
    if (tensors_[id]) (void)forget_failed_load(id);
}

void executor::check_loads(std::span<const tensor_id> ids) {
  // A tensor read from NVMe is checked (CRC32C) before the op runs: a failed read must never
  // reach a kernel. Loads from the host tier cannot fail. Only the read is waited for here: its
  // H2D copy is then enqueued, and the op waits for it on the device.
  for (auto id : ids) {
    auto& st = state(id);
    if (!st.loaded_from_nvme || !st.pending_load.valid()) continue;
    try {
      st.pending_load.wait_enqueued();
    } catch (...) {
      const auto error = std::current_exception();
      (void)forget_failed_load(id);
      forget_failed_loads();  // the iteration ends here (Note [Failed loads])
      std::rethrow_exception(error);
    }
    st.loaded_from_nvme = false;
  }
}

// Note [Abandoned ops]
// An owner whose code throws between begin_op and end_op (a kernel launch the device refused, a
// workspace that did not fit, its own error) cannot end the op as though it ran: it calls
// abandon_op. The op got as far as the owner's code took it: what it enqueued runs, what it did
// not does not. So a tensor it writes whose device copy held a value keeps that copy as its value,
// the one from before the op or what the op made of it, as after end_op: its tier copy, stale
// now, goes. The tensors of one in-place update (a weight and its optimizer state) so stay of one
// step. A tensor whose device copy held nothing (an output not yet written) keeps its tier copy,
// if any, and the device copy goes (freed on compute, after whatever the op enqueued). A host
// op's writes are in their host-tier copies only, which keep what its code made of them. The
// op's scratch goes back on compute too. The iteration has failed, so the plan is left for the
// rest of it: the plan's evictions after the op are not made, and the recomputation temporaries
// go (no later step reruns anything).

void executor::abandon_op() {
  const bool host = host_op_open_;
  const bool open = std::exchange(op_open_, false);
  host_op_open_ = false;
  open_op_ = nullptr;  // its start stamp has no end: the timeline shows it as not run
  op_done_current_ = false;
  pinned_.clear();
  const auto writes = std::exchange(writes_, {});
  abandon_plan();
  if (!open) return;
  free_scratch();
  if (!host) {
    for (auto id : writes) {
      auto& st = state(id);
      ++st.version;
      st.awaiting_rerun = false;
      if (st.dev != nullptr && st.dev_valid) {
        if (st.tier_current) backing_->discard(id);
        st.tier_current = false;
      } else if (st.tier_current) {
        drop_device(id);
      }
    }
  }
  free_rerun_temps(current_op_);
}

void executor::rethrow_move_errors() {
  // A failed load's device copy goes first (Note [Failed loads]); the first error is reported.
  std::exception_ptr load_error;
  for (tensor_id id = 0; id < tensors_.size(); ++id) {
    if (!tensors_[id] || !tensors_[id]->pending_load.valid()) continue;
    auto e = tensors_[id]->pending_load.error();
    if (e && forget_failed_load(id) && !load_error) load_error = std::move(e);
  }
  for (auto& t : tensors_) {
    if (!t) continue;
    for (auto* h : {&t->pending_save, &t->pending_load}) {
      if (!h->valid()) continue;
      auto e = h->error();
      *h = {};
      if (e) std::rethrow_exception(e);
    }
  }
  if (load_error) std::rethrow_exception(load_error);
}

}  // namespace spillway
