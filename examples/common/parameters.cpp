// Parameter registration (value, gradient, Adam moments in chunks), the global-norm clipping
// ops, and the Adam ops, one per moment chunk, which update the value and both moments in place.
#include "examples/common/parameters.hpp"

#include <algorithm>
#include <cmath>

#include "device/error.hpp"
#include "examples/common/device_io.hpp"
#include "kernels/cpu_adam.hpp"
#include "kernels/grad_norm.hpp"

#include "kernels/bf16.hpp"

namespace spillway::examples {

parameter parameter_set::add(Session& s, const std::string& name, const std::vector<float>& initial) {
  parameter p;
  p.name = name;
  p.index = params_.size();
  p.count = initial.size();
  const std::uint64_t bytes = p.count * element_bytes(prec_);
  if (prec_ == precision::bf16) {
    std::vector<kernels::bf16> rounded(initial.size());
    for (std::size_t i = 0; i < initial.size(); ++i) rounded[i] = kernels::to_bf16(initial[i]);
    p.value = s.add_persistent(name, bytes, tensor_kind::parameter, rounded.data());
    const auto [first, last] = comm::shard_range(p.count, shares_.ranks(), shares_.rank());
    p.master = s.add_persistent(name + ".master", std::max<std::size_t>(1, last - first) * sizeof(float),
                                tensor_kind::optimizer_state, initial.data() + first);
  } else {
    p.value = s.add_persistent(name, bytes, tensor_kind::parameter, initial.data());
  }
  p.grad = s.add_persistent(name + ".grad", bytes, tensor_kind::gradient);
  // This rank's shard of the optimizer state (ZeRO): all of it outside a data-parallel job.
  const auto [first, last] = comm::shard_range(p.count, shares_.ranks(), shares_.rank());
  p.shard_first = first;
  p.shard_count = last - first;
  if (shares_.count > 1 && !shares_.comm)  // ranks sum in their reduction buffer instead
    p.grad_sum = s.add_persistent(name + ".grad_sum", p.count * sizeof(float), tensor_kind::gradient);
  const std::size_t chunks = std::max<std::size_t>(1, (p.shard_count + moment_chunk - 1) / moment_chunk);
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::string suffix = chunks == 1 ? "" : "." + std::to_string(c);
    const std::uint64_t n = std::max<std::size_t>(1, std::min(moment_chunk, p.shard_count - std::min(p.shard_count, c * moment_chunk))) * sizeof(float);
    p.m.push_back(s.add_persistent(name + ".adam_m" + suffix, n, tensor_kind::optimizer_state));
    p.v.push_back(s.add_persistent(name + ".adam_v" + suffix, n, tensor_kind::optimizer_state));
  }
  params_.push_back(p);
  total_ += p.count;
  return p;
}

void parameter_set::adam_step(Session& s, kernels::kernel_context& ctx, const kernels::adam_config& config,
                              std::int64_t step) const {
  kernels::adam_config warmed = config;
  warmed.lr = warmup_lr(config.lr, step);
  // Last registered first: the backward pass gives the last layers' gradients first, so a step
  // the plan runs on the host can start while the device works on earlier layers' backward ops
  // (Note [Host ops in the executor]). Each update is independent of the others: same bits.
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) adam_parameter(s, ctx, warmed, step, *it);
}

void parameter_set::adam_parameter(Session& s, kernels::kernel_context& ctx, const kernels::adam_config& warmed,
                                   std::int64_t step, const parameter& p) const {
  {
    for (std::size_t c = 0; c < p.m.size(); ++c) {
      // Over this rank's shard; the master holds the shard alone (Note [Micro-batches]).
      const std::size_t first = p.shard_first + c * moment_chunk;
      const std::size_t mfirst = c * moment_chunk;
      const std::size_t n = std::min(moment_chunk, p.shard_count - mfirst);
      if (n == 0) continue;  // a rank with no element of a tiny parameter
      const std::string op_name = p.m.size() == 1 ? p.name + ".adam" : p.name + ".adam." + std::to_string(c);
      // Note [Host-capable ops] in offload/session_host_ops.cpp: the plan runs each step on the
      // device (adam_step) or on the host (cpu_adam_step, the same bits), 28 bytes per parameter.
      const double host_bytes = 28.0 * static_cast<double>(n);
      if (prec_ == precision::bf16) {
        s.host_capable_op(
            op_name, {p.master, p.grad, p.m[c], p.v[c]}, {p.master, p.m[c], p.v[c], p.value},
            [&](const Session::op_scope& op) {
              kernels::adam_step(ctx, op.stream(), op.ptr<float>(p.master) + mfirst,
                                 op.ptr<kernels::bf16>(p.grad) + first, op.ptr<float>(p.m[c]), op.ptr<float>(p.v[c]),
                                 op.ptr<kernels::bf16>(p.value) + first, n, warmed, step);
            },
            [&](const host_access& x) {
              kernels::cpu_adam_step(x.ptr<float>(p.master) + mfirst, x.ptr<kernels::bf16>(p.grad) + first,
                                     x.ptr<float>(p.m[c]), x.ptr<float>(p.v[c]), x.ptr<kernels::bf16>(p.value) + first,
                                     n, warmed, step);
            },
            13.0 * static_cast<double>(n), host_bytes);
        continue;
      }
      s.host_capable_op(
          op_name, {p.value, p.grad, p.m[c], p.v[c]}, {p.value, p.m[c], p.v[c]},
          [&](const Session::op_scope& op) {
            kernels::adam_step(ctx, op.stream(), op.ptr<float>(p.value) + first, op.ptr<float>(p.grad) + first,
                               op.ptr<float>(p.m[c]), op.ptr<float>(p.v[c]), n, warmed, step);
          },
          [&](const host_access& x) {
            kernels::cpu_adam_step(x.ptr<float>(p.value) + first, x.ptr<float>(p.grad) + first, x.ptr<float>(p.m[c]),
                                   x.ptr<float>(p.v[c]), n, warmed, step);
          },
          12.0 * static_cast<double>(n), host_bytes);
    }
  }
}

void parameter_set::clip_grad_norm(Session& s, kernels::kernel_context& ctx, float max_norm) const {
  SPILLWAY_EXPECTS_T(usage_error, max_norm >= 0.0f && std::isfinite(max_norm),
                     "clip_grad_norm: the max norm " + std::to_string(max_norm) +
                         " is not 0 (off) or a positive number");
  if (max_norm == 0.0f || params_.empty()) return;
  std::size_t largest = 0;
  for (const auto& p : params_) largest = std::max(largest, p.count);
  // One workspace for every norm op (the partial sums of the largest gradient fit it), and the
  // sum itself; both live from the first norm op to the last op that reads them.
  const op_workspace ws(s, "grad_norm.workspace", kernels::sum_of_squares_workspace_bytes(largest));
  const tensor_handle sum_sq = s.add_transient("grad_norm.sum_sq", sizeof(float));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const parameter& p = params_[i];
    const bool first = i == 0;
    const double flops = 2.0 * static_cast<double>(p.count);
    auto op = first ? s.op(p.name + ".optim.norm", {p.grad}, {sum_sq, ws.handle()}, flops)
                    : s.op(p.name + ".optim.norm", {p.grad, sum_sq}, {sum_sq, ws.handle()}, flops);
    const auto bound = ws.bind(op, ctx);
    if (prec_ == precision::bf16)
      kernels::sum_of_squares(ctx, op.stream(), op.ptr<kernels::bf16>(p.grad), p.count, op.ptr<float>(sum_sq), !first);
    else
      kernels::sum_of_squares(ctx, op.stream(), op.ptr<float>(p.grad), p.count, op.ptr<float>(sum_sq), !first);
  }
  ws.release(s);
  for (const auto& p : params_) {
    auto op = s.op(p.name + ".optim.clip", {p.grad, sum_sq}, {p.grad}, static_cast<double>(p.count));
    if (prec_ == precision::bf16)
      kernels::clip_by_norm(ctx, op.stream(), op.ptr<kernels::bf16>(p.grad), p.count, op.ptr<float>(sum_sq), max_norm);
    else
      kernels::clip_by_norm(ctx, op.stream(), op.ptr<float>(p.grad), p.count, op.ptr<float>(sum_sq), max_norm);
  }
  s.release(sum_sq);
}

}  // namespace spillway::examples
