// Session::host_capable_op: an op with a device and a host implementation, placed by the plan.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "offload/session_call.hpp"
#include "offload/session_impl.hpp"

namespace spillway {

// Note [Host-capable ops]
// A loop gives an op both implementations; the trace marks it host_capable, with the bytes and
// flops its host body costs, and the planner decides where it runs (Note [Host placement] in
// offload/planner_host.cpp) as the setting host_ops allows. The recording iteration runs the
// device body (every op runs on the device while recording). A later iteration that follows a
// plan placing the op on the host asks the executor for host-tier copies of its tensors (Note
// [Host ops in the executor] in prefetch/executor_host.cpp) and runs the host body over them on
// the calling thread. A split parent cannot be named: its pieces have no one host buffer.
void session_impl::check_host_capable(const std::string& name, std::span<const tensor_handle> reads,
                                      std::span<const tensor_handle> writes) const {
  for (auto list : {reads, writes}) {
    for (auto t : list) {
      check_handle(t);
      SPILLWAY_EXPECTS_T(usage_error, !splits.contains(t.id),
                         "host_capable_op(\"" + name + "\"): names \"" + tensors[t.id].name +
                             "\", which is split into views; a host-capable op names the views it uses");
    }
  }
}

void session_impl::run_host_body(std::uint32_t k, const Session::host_body& body) {
  const Session::op_scope scope(this, k, /*rerun=*/true);  // ends nothing when it goes: end_op does
  Session::op_scope::host_access access(&scope);
  const auto& d = ops.at(k);
  std::size_t i = 0;
  for (auto id : d.reads) access.ptrs_.emplace_back(id, host_ptrs.at(i++));
  for (auto id : d.writes) access.ptrs_.emplace_back(id, host_ptrs.at(i++));
  body(access);
}

double session_impl::host_memory_rate() {
  if (host_rate > 0) return host_rate;
  // A copy of 32 MiB, best of three: it reads and writes each byte once.
  constexpr std::size_t n = std::size_t{32} << 20;
  const auto a = std::make_unique<std::byte[]>(n);
  const auto b = std::make_unique<std::byte[]>(n);
  std::memset(a.get(), 1, n);
  std::memset(b.get(), 0, n);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.get(), a.get(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  host_rate = 2.0 * static_cast<double>(n) / std::max(best, 1e-6);
  return host_rate;
}

void Session::host_capable_op(std::string_view name, std::initializer_list<tensor_handle> reads,
                              std::initializer_list<tensor_handle> writes, const op_body& device_body,
                              const host_body& host_body, double flops, double host_bytes) {
  host_capable_op(name, std::span<const tensor_handle>(reads.begin(), reads.size()),
                  std::span<const tensor_handle>(writes.begin(), writes.size()), device_body, host_body, flops,
                  host_bytes);
}

void Session::host_capable_op(std::string_view name, std::span<const tensor_handle> reads,
                              std::span<const tensor_handle> writes, const op_body& device_body,
                              const host_body& host_body, double flops, double host_bytes) {
  const std::string op_name(name);
  const session_detail::session_call claim(*impl_, "host_capable_op", op_name);
  SPILLWAY_EXPECTS_T(usage_error, static_cast<bool>(device_body) && static_cast<bool>(host_body),
                     "host_capable_op(\"" + op_name + "\"): give both a device body and a host body");
  SPILLWAY_EXPECTS_T(config_error, host_bytes >= 0,
                     "host_capable_op(\"" + op_name + "\"): host_bytes is negative; give 0 (its tensors' bytes) or more");
  impl_->check_host_capable(op_name, reads, writes);
  const auto k = impl_->open_op(name, reads, writes, {}, flops, session_detail::phase_from_name(name), false, host_bytes);
  if (!impl_->open_on_host) {
    op_scope scope(impl_.get(), k);
    device_body(scope);
    return;
  }
  try {
    impl_->run_host_body(k, host_body);
  } catch (...) {
    impl_->note_failure();  // the step has failed (Note [Failed iterations])
    try {
      impl_->end_op(k);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the body's exception wins
    }
    throw;
  }
  impl_->end_op(k);
}

}  // namespace spillway
