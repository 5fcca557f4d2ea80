// op_scope::run: plain host code over an op's tensors, in stream order, on either backend.
#include <exception>

#include "offload/session_call.hpp"
#include "offload/session_impl.hpp"

namespace spillway {

// Note [Host runs]
// A loop written for the CPU calls its layer functions on plain pointers. op_scope::run gives
// them host pointers to the op's tensors at the point in stream order where the op's work
// would run, and returns when they have run:
//  * on the cpu backend the device memory is host memory: `f` is enqueued on the op's stream as
//    a host function (so it runs after the work before it, where stream work may touch device
//    memory, which the debug mode cpu_debug_host_access relies on) and the caller waits for it;
//  * on a GPU the tensors are copied to pinned host memory kept by the Session (device to host on
//    the op's stream, then a wait), `f` runs on the caller's thread, and tensors the op writes
//    or accumulates are copied back on the stream. Tensors the op only writes are copied in too:
//    the op's kernels before run() may have written part of them, and `f` sees what they wrote
//    as it does on the cpu backend (and what it leaves alone goes back unchanged); the next run's wait orders the reuse of the
//    staging memory. session_hooks::stage_host_runs takes this path on the cpu backend too, so
//    tests cover it.
// A parent named by the op is its gathered copy (Note [Views]), like ptr(). An exception from
// `f` reaches the caller; on a GPU nothing is copied back then.

void session_impl::run_on_host(const std::function<void(const Session::op_scope::host_access&)>& f,
                               const Session::op_scope::host_access& access,
                               std::vector<std::pair<tensor_id, void*>>& ptrs) {
  SPILLWAY_EXPECTS_T(usage_error, op_open, "run() of an op whose scope has ended");
  const stream s = exec->compute_stream();
  if (dev->properties().backend == backend::cpu && !stage_host_runs) {
    for (const auto& n : open_named) ptrs.emplace_back(n.id, op_ptr(tensor_handle{n.id}));
    std::exception_ptr failure;
    dev->launch_host(s, [&] {
      try {
        f(access);
      } catch (...) {
        failure = std::current_exception();
      }
    });
    dev->synchronize_stream(s);
    if (failure) std::rethrow_exception(failure);
    return;
  }
  std::uint64_t total = 0;
  for (const auto& n : open_named) total += round_up(tensors[n.id].bytes, 256);
  if (total > host_staging_bytes) {
    dev->synchronize_stream(s);  // the last run's copies back may still read the old staging
    if (host_staging != nullptr) dev->deallocate_pinned(host_staging, host_staging_bytes);
    host_staging = nullptr;
    host_staging_bytes = 0;
    host_staging = dev->allocate_pinned(total);
    host_staging_bytes = total;
  }
  std::uint64_t at = 0;
  for (const auto& n : open_named) {
    void* host = static_cast<std::byte*>(host_staging) + at;
    at += round_up(tensors[n.id].bytes, 256);
    ptrs.emplace_back(n.id, host);
    dev->copy_async(host, op_ptr(tensor_handle{n.id}), tensors[n.id].bytes, copy_kind::device_to_host, s);
  }
  dev->synchronize_stream(s);
  f(access);
  for (std::size_t i = 0; i < open_named.size(); ++i) {
    const auto& n = open_named[i];
    if (n.written)
      dev->copy_async(op_ptr(tensor_handle{n.id}), ptrs[i].second, tensors[n.id].bytes, copy_kind::host_to_device, s);
  }
}

void Session::op_scope::run(const std::function<void(const host_access&)>& f) const {
  SPILLWAY_EXPECTS_T(usage_error, s_ != nullptr, "run() of an op scope that was moved from");
  const session_detail::session_call claim(*s_, "an op scope's run()");
  SPILLWAY_EXPECTS_T(usage_error, !stale(), "run() of an op scope whose op is no longer open (its iteration was given up)");
  host_access access(this);
  try {
    s_->run_on_host(f, access, access.ptrs_);
  } catch (...) {
    s_->note_failure();
    throw;
  }
}

void* Session::op_scope::host_access::raw_ptr(tensor_handle t) const {
  for (const auto& [id, p] : ptrs_)
    if (id == t.id) return p;
  const auto& s = *op_->s_;
  throw usage_error("run(): op \"" + s.ops.at(op_->index_).name + "\" asked for the host pointer of tensor " +
                    (t.id < s.tensors.size() ? "\"" + s.tensors[t.id].name + "\"" : std::to_string(t.id)) +
                    ", which it does not name in its reads, writes or accumulations");
}

}  // namespace spillway
