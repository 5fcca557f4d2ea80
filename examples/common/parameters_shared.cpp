// A training step over the shares of a batch: micro-batches in one process, or one per rank of
// a data-parallel job with the optimizer state sharded (ZeRO stage 1 or 2).
#include <algorithm>
#include <vector>

#include "device/error.hpp"
#include "examples/common/device_io.hpp"
#include "examples/common/parameters.hpp"
#include "kernels/elementwise.hpp"

namespace spillway::examples {

// Note [Micro-batches]
// A step's batch may be split into N equal micro-batches (--micro-batches N in one process, or
// one per rank under --data-parallel on N ranks). Each micro-batch's forward and backward pass
// leaves its gradient in the parameters' gradient tensors, computed from zero (the first by the
// Session's zero-fill, later ones after an explicit zeroing op); the harness then adds it into
// "<name>.grad_sum" in fp32 (the first copied, widened from bf16), so the sum is
// ((g_0 + g_1) + g_2) + ... in micro-batch order. On ranks, each rank holds one micro-batch's
// gradient and the communicator sums them in rank order (Note [Fixed-order reductions] in
// comm/communicator.hpp), bucket by bucket while the backward pass goes on (Note [Overlapped
// gradient exchange] in gradient_exchange.hpp): the same additions, so the same bits. The sum times 1/N, rounded to
// the gradient's format, is what Adam reads; each rank updates only its shard of the elements
// (shard_range), with moments (and, in bf16, the fp32 master) for that shard alone, and the
// updated weights are then gathered by every rank. Adam is element by element, so a shard's
// update is the same bits as the whole one. The step's loss is the micro-batches' mean losses
// added in order, over N. So N ranks give the losses of one process with --micro-batches N, bit
// for bit, under every policy, and any run gives the same losses again.

// Note [Updates in the backward pass]
// In a step of one whole batch without clipping, each parameter's Adam update runs as soon as
// the backward pass hands its gradient over (gradient_ready), not after the whole pass, as
// PyTorch users do with post-accumulate-grad hooks. The update reads the parameter, its gradient
// and its moments, which no later op of the pass reads or writes, so every element gets the
// same arithmetic on the same bits: the losses do not change. What changes is the trace: the
// moments, the largest share of the bytes that leave the device, can stream in and out while the
// rest of the backward pass computes, instead of after it with the compute idle (GPT medium at
// 1/4 of its footprint on an H200-like profile: 60.2 -> 53.8 ms planned; the MLP, 111 -> 88).
// Clipping needs the norm of every gradient first, and micro-batches and ranks the sum of every
// share's gradient, so those steps update after the pass, as before.
// Updates the plan runs on the host are the exception: a host op runs on the calling thread,
// which then enqueues nothing for the device until it ends, so one in the middle of the backward
// pass leaves the device idle, while after the pass it overlaps the device's backward work still
// queued (Note [Host ops in the executor]). So with host_ops "host" the updates come after the
// pass from the start, and with "auto" from the first step whose plan puts an update on the
// host: that step departs from its recording and is recorded again, once (the losses do not
// change either way). On an H200-like profile with a 16-core host of 80 GB/s
// (bench/profiles/h200-gpu-check-host80.json, spillway-bench plan --fit-step-ms), GPT medium at
// 1/4 plans at 47.3 ms with its updates after the pass on the host and 52.7 in the backward pass
// on the device; the MLP at 82.6 and 73.4: each order wins where its placement does.

float parameter_set::train_step(Session& s, kernels::kernel_context& ctx, std::int64_t step,
                                const std::function<void(int)>& pass, const std::function<float()>& read_loss,
                                const kernels::adam_config& config, float clip_norm) const {
  if (!updates_after_pass_) {
    const plan* p = s.current_plan();
    updates_after_pass_ = s.config().host_ops == "host" || (p != nullptr && p->host_op_count() > 0);
  }
  if (shares_.count == 1 && clip_norm == 0.0f && !updates_after_pass_) {
    in_backward_.on = true;
    in_backward_.warmed = config;
    in_backward_.warmed.lr = warmup_lr(config.lr, step);
    in_backward_.step = step;
    in_backward_.done.assign(params_.size(), false);
    try {
      pass(0);
    } catch (...) {
      in_backward_.on = false;
      throw;
    }
    in_backward_.on = false;
    for (auto it = params_.rbegin(); it != params_.rend(); ++it)  // those the pass did not hand over
      if (!in_backward_.done[it->index]) adam_parameter(s, ctx, in_backward_.warmed, step, *it);
    return read_loss();
  }
  if (shares_.count == 1) {
    pass(0);
    clip_grad_norm(s, ctx, clip_norm);
    adam_step(s, ctx, config, step);
    return read_loss();
  }
  SPILLWAY_EXPECTS_T(usage_error, clip_norm == 0.0f,
                     "gradient clipping over micro-batches or ranks is not supported; give a clip norm of 0");
  if (shares_.comm) return exchange_step(s, ctx, step, pass, read_loss, config);
  std::vector<float> losses(static_cast<std::size_t>(shares_.count), 0.0f);
  for (int i = 0; i < shares_.local; ++i) {
    if (i > 0) zero_gradients(s);
    pass(shares_.first + i);
    losses[static_cast<std::size_t>(shares_.first + i)] = read_loss();
    add_micro_batch(s, ctx, i);
  }
  reduce_gradients(s, ctx);
  adam_step(s, ctx, config, step);
  float total = losses[0];
  for (std::size_t i = 1; i < losses.size(); ++i) total += losses[i];
  return total / static_cast<float>(shares_.count);
}

// One micro-batch on each rank (Note [Overlapped gradient exchange]).
float parameter_set::exchange_step(Session& s, kernels::kernel_context& ctx, std::int64_t step,
                                   const std::function<void(int)>& pass, const std::function<float()>& read_loss,
                                   const kernels::adam_config& config) const {
  if (!exchange_) exchange_ = std::make_shared<gradient_exchange>(s.device(), shares_, prec_, params_);
  exchange_->begin_step();
  pass(shares_.first);
  exchange_->end_backward(s, ctx, params_);  // before the loss is read: the last bucket goes now
  std::vector<float> losses(static_cast<std::size_t>(shares_.count), 0.0f);
  losses[static_cast<std::size_t>(shares_.first)] = read_loss();
  // Each parameter's step as soon as its bucket is reduced, and its new shard out to the others.
  kernels::adam_config warmed = config;
  warmed.lr = warmup_lr(config.lr, step);
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    exchange_->finish(s, ctx, *it);
    adam_parameter(s, ctx, warmed, step, *it);
    exchange_->stage_update(s, *it);
  }
  exchange_->end_updates();
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) exchange_->load_update(s, *it);
  exchange_->wait_all();  // the communicator is the caller's again
  shares_.comm->all_gather(&losses[static_cast<std::size_t>(shares_.first)], losses.data(), losses.size(),
                           sizeof(float));
  float total = losses[0];
  for (std::size_t i = 1; i < losses.size(); ++i) total += losses[i];
  return total / static_cast<float>(shares_.count);
}

void parameter_set::gradient_ready(Session& s, kernels::kernel_context& ctx, const parameter& p) const {
  if (in_backward_.on) {
    SPILLWAY_EXPECTS_T(usage_error, p.index < in_backward_.done.size() && !in_backward_.done[p.index],
                       "gradient_ready: \"" + p.name + "\" was handed over twice in one pass (or is not a parameter "
                       "of this set)");
    adam_parameter(s, ctx, in_backward_.warmed, in_backward_.step, p);
    in_backward_.done[p.index] = true;
    return;
  }
  if (exchange_ && shares_.comm) exchange_->stage(s, ctx, p);
}

void parameter_set::zero_gradients(Session& s) const {
  for (const auto& p : params_) {
    auto op = s.op(p.name + ".grad.zero", {}, {p.grad});
    op.device().memset_async(op.ptr(p.grad), 0, p.count * element_bytes(prec_), op.stream());
  }
}

void parameter_set::add_micro_batch(Session& s, kernels::kernel_context& ctx, int local_index) const {
  const bool half = prec_ == precision::bf16;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    const parameter& p = *it;
    const double flops = static_cast<double>(p.count);
    if (local_index == 0) {
      auto op = s.op(p.name + ".grad.sum", {p.grad}, {p.grad_sum}, flops);
      if (half)
        kernels::convert(ctx, op.stream(), op.ptr<kernels::bf16>(p.grad), op.ptr<float>(p.grad_sum), p.count);
      else
        op.device().copy_async(op.ptr(p.grad_sum), op.ptr(p.grad), p.count * sizeof(float), copy_kind::device_to_device,
                               op.stream());
      continue;
    }
    if (!half) {
      auto op = s.op(p.name + ".grad.sum", {p.grad, p.grad_sum}, {p.grad_sum}, flops);
      kernels::add(ctx, op.stream(), op.ptr<float>(p.grad_sum), op.ptr<float>(p.grad), op.ptr<float>(p.grad_sum), p.count);
      continue;
    }
    const op_workspace wide(s, p.name + ".grad.widened", p.count * sizeof(float));
    {
      auto op = s.op(p.name + ".grad.sum", {p.grad, p.grad_sum}, {p.grad_sum, wide.handle()}, flops);
      kernels::convert(ctx, op.stream(), op.ptr<kernels::bf16>(p.grad), op.ptr<float>(wide.handle()), p.count);
      kernels::add(ctx, op.stream(), op.ptr<float>(p.grad_sum), op.ptr<float>(wide.handle()), op.ptr<float>(p.grad_sum),
                   p.count);
    }
    wide.release(s);
  }
}

void parameter_set::reduce_gradients(Session& s, kernels::kernel_context& ctx) const {
  // Micro-batches in one process: the sum is all here; the mean of it is what Adam reads.
  const float inv = 1.0f / static_cast<float>(shares_.count);
  const bool half = prec_ == precision::bf16;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    const parameter& p = *it;
    if (!half) {
      auto op = s.op(p.name + ".grad.mean", {p.grad_sum}, {p.grad}, static_cast<double>(p.count));
      kernels::scale(ctx, op.stream(), op.ptr<float>(p.grad_sum), inv, op.ptr<float>(p.grad), p.count);
      continue;
    }
    const op_workspace scaled(s, p.name + ".grad.scaled", p.count * sizeof(float));
    {
      auto op = s.op(p.name + ".grad.mean", {p.grad_sum}, {p.grad, scaled.handle()}, static_cast<double>(p.count));
      kernels::scale(ctx, op.stream(), op.ptr<float>(p.grad_sum), inv, op.ptr<float>(scaled.handle()), p.count);
      kernels::convert(ctx, op.stream(), op.ptr<float>(scaled.handle()), op.ptr<kernels::bf16>(p.grad), p.count);
    }
    scaled.release(s);
  }
}

}  // namespace spillway::examples
