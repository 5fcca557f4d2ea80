// gradient_exchange: staging, buckets and the copy back (Note [Overlapped gradient exchange]).
#include "examples/common/gradient_exchange.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "device/error.hpp"
#include "examples/common/device_io.hpp"
#include "examples/common/parameters.hpp"
#include "kernels/elementwise.hpp"

namespace spillway::examples {

gradient_exchange::gradient_exchange(Device& device, const batch_shares& shares, precision prec,
                                     const std::vector<parameter>& params)
    : device_(&device), comm_(shares.comm), zero_(shares.zero), prec_(prec), bucket_limit_(shares.bucket_bytes),
      elem_bytes_(element_bytes(prec)) {
  SPILLWAY_EXPECTS_T(usage_error, comm_ != nullptr, "gradient_exchange: not a data-parallel job (no communicator)");
  for (const parameter& p : params) {
    slots_.push_back({host_floats_, p.count, p.shard_first, p.shard_count});
    host_floats_ += p.count;
  }
  ticket_.assign(params.size(), 0);
  gather_ticket_.assign(params.size(), 0);
  staged_.assign(params.size(), false);
  host_ = static_cast<float*>(device_->allocate_pinned(std::max<std::size_t>(1, host_floats_) * sizeof(float)));
  try {
    host_values_ = static_cast<std::byte*>(device_->allocate_pinned(std::max<std::size_t>(1, host_floats_) * elem_bytes_));
  } catch (...) {
    device_->deallocate_pinned(host_, std::max<std::size_t>(1, host_floats_) * sizeof(float));
    throw;
  }
  stream_ = std::make_unique<comm::collective_stream>(*device_);
}

gradient_exchange::~gradient_exchange() {
  stream_.reset();  // its jobs use host_
  try {
    device_->synchronize();  // copies back may still read host_
  } catch (...) {
    // A failed device has run its last copy: the memory is safe to free.
  }
  device_->deallocate_pinned(host_, std::max<std::size_t>(1, host_floats_) * sizeof(float));
  device_->deallocate_pinned(host_values_, std::max<std::size_t>(1, host_floats_) * elem_bytes_);
}

void gradient_exchange::begin_step() {
  std::fill(staged_.begin(), staged_.end(), false);
  std::fill(ticket_.begin(), ticket_.end(), 0);
  std::fill(gather_ticket_.begin(), gather_ticket_.end(), 0);
  bucket_.clear();
  bucket_bytes_ = 0;
  gather_bucket_.clear();
  gather_bytes_ = 0;
  in_backward_ = true;
}

void gradient_exchange::stage(Session& s, kernels::kernel_context& ctx, const parameter& p) {
  SPILLWAY_EXPECTS_T(usage_error, p.index < slots_.size() && !staged_[p.index],
                     "gradient_ready: \"" + p.name + "\" was handed over twice in one pass (or is not a parameter "
                     "of this set); hand each gradient over once, after the op that last writes it");
  const slot& sl = slots_[p.index];
  float* dst = host_ + sl.offset;
  const std::size_t bytes = sl.count * sizeof(float);
  if (prec_ == precision::bf16) {
    const op_workspace wide(s, p.name + ".grad.widened", bytes);
    {
      auto op = s.op(p.name + ".grad.stage", {p.grad}, {wide.handle()}, static_cast<double>(sl.count));
      kernels::convert(ctx, op.stream(), op.ptr<kernels::bf16>(p.grad), op.ptr<float>(wide.handle()), sl.count);
      op.device().copy_async(dst, op.ptr(wide.handle()), bytes, copy_kind::device_to_host, op.stream());
      last_stream_ = op.stream();
    }
    wide.release(s);
  } else {
    auto op = s.op(p.name + ".grad.stage", {p.grad}, {});
    op.device().copy_async(dst, op.ptr(p.grad), bytes, copy_kind::device_to_host, op.stream());
    last_stream_ = op.stream();
  }
  have_stream_ = true;
  staged_[p.index] = true;
  (in_backward_ ? stats_.staged_in_backward : stats_.staged_after) += 1;
  bucket_.push_back(p.index);
  bucket_bytes_ += bytes;
  if (bucket_bytes_ >= bucket_limit_) queue_bucket();
}

void gradient_exchange::queue_bucket() {
  if (bucket_.empty()) return;
  std::vector<slot> items;
  for (const std::size_t i : bucket_) items.push_back(slots_[i]);
  const comm::collective_stream::ticket t = stream_->enqueue(
      last_stream_, [comm = comm_, zero = zero_, host = host_, items = std::move(items)] {
        for (const slot& it : items) {
          float* g = host + it.offset;
          if (zero == 1) {
            comm->all_reduce_sum(g, it.count);
            continue;
          }
          std::vector<float> shard(it.shard_count);
          comm->reduce_scatter_sum(g, shard.data(), it.count);
          std::copy(shard.begin(), shard.end(), g + it.shard_first);
        }
      });
  for (const std::size_t i : bucket_) ticket_[i] = t;
  ++stats_.buckets;
  if (in_backward_) ++stats_.buckets_in_backward;
  bucket_.clear();
  bucket_bytes_ = 0;
}

void gradient_exchange::end_backward(Session& s, kernels::kernel_context& ctx, const std::vector<parameter>& params) {
  in_backward_ = false;
  for (auto it = params.rbegin(); it != params.rend(); ++it)
    if (!staged_[it->index]) stage(s, ctx, *it);
  queue_bucket();
}

void gradient_exchange::finish(Session& s, kernels::kernel_context& ctx, const parameter& p) {
  SPILLWAY_EXPECTS_T(usage_error, p.index < ticket_.size() && ticket_[p.index] != 0,
                     "gradient_exchange::finish: \"" + p.name + "\" has no reduction queued this step");
  stream_->wait(ticket_[p.index]);
  const slot& sl = slots_[p.index];
  if (sl.shard_count == 0) return;
  const float* reduced = host_ + sl.offset + sl.shard_first;
  const std::size_t bytes = sl.shard_count * sizeof(float);
  const float inv = 1.0f / static_cast<float>(comm_->size());
  const auto flops = static_cast<double>(sl.shard_count);
  if (prec_ == precision::bf16) {
    const op_workspace scaled(s, p.name + ".grad.scaled", bytes);
    {
      auto op = s.op(p.name + ".grad.mean", {}, {p.grad, scaled.handle()}, flops);
      float* w = op.ptr<float>(scaled.handle());
      op.device().copy_async(w, reduced, bytes, copy_kind::host_to_device, op.stream());
      kernels::scale(ctx, op.stream(), w, inv, w, sl.shard_count);
      kernels::convert(ctx, op.stream(), w, op.ptr<kernels::bf16>(p.grad) + sl.shard_first, sl.shard_count);
    }
    scaled.release(s);
    return;
  }
  auto op = s.op(p.name + ".grad.mean", {}, {p.grad}, flops);
  float* g = op.ptr<float>(p.grad) + sl.shard_first;
  op.device().copy_async(g, reduced, bytes, copy_kind::host_to_device, op.stream());
  kernels::scale(ctx, op.stream(), g, inv, g, sl.shard_count);
}

void gradient_exchange::stage_update(Session& s, const parameter& p) {
  const slot& sl = slots_[p.index];
  if (sl.shard_count > 0) {
    auto op = s.op(p.name + ".gather.stage", {p.value}, {});
    op.device().copy_async(host_values_ + (sl.offset + sl.shard_first) * elem_bytes_,
                           op.ptr<std::byte>(p.value) + sl.shard_first * elem_bytes_, sl.shard_count * elem_bytes_,
                           copy_kind::device_to_host, op.stream());
    last_stream_ = op.stream();
  }
  gather_bucket_.push_back(p.index);
  gather_bytes_ += sl.count * elem_bytes_;
  if (gather_bytes_ >= bucket_limit_) queue_gather();
}

void gradient_exchange::queue_gather() {
  if (gather_bucket_.empty()) return;
  std::vector<slot> items;
  for (const std::size_t i : gather_bucket_) items.push_back(slots_[i]);
  const comm::collective_stream::ticket t = stream_->enqueue(
      last_stream_, [comm = comm_, host = host_values_, elem = elem_bytes_, items = std::move(items)] {
        for (const slot& it : items) {
          std::byte* w = host + it.offset * elem;
          comm->all_gather(w + it.shard_first * elem, w, it.count, elem);
        }
      });
  for (const std::size_t i : gather_bucket_) gather_ticket_[i] = t;
  gather_bucket_.clear();
  gather_bytes_ = 0;
}

void gradient_exchange::end_updates() { queue_gather(); }

void gradient_exchange::load_update(Session& s, const parameter& p) {
  SPILLWAY_EXPECTS_T(usage_error, p.index < gather_ticket_.size() && gather_ticket_[p.index] != 0,
                     "gradient_exchange::load_update: \"" + p.name + "\" has no gather queued this step");
  stream_->wait(gather_ticket_[p.index]);
  const slot& sl = slots_[p.index];
  auto op = s.op(p.name + ".gather.load", {}, {p.value});
  op.device().copy_async(op.ptr(p.value), host_values_ + sl.offset * elem_bytes_, sl.count * elem_bytes_,
                         copy_kind::host_to_device, op.stream());
}

void gradient_exchange::wait_all() { stream_->wait_all(); }

}  // namespace spillway::examples
