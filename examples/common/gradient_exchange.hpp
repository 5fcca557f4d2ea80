// gradient_exchange: a data-parallel rank's gradients summed over the ranks in buckets, each
// queued on a collective stream as soon as the backward pass has produced it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/collective_stream.hpp"
#include "examples/common/precision.hpp"
#include "examples/common/shares.hpp"
#include "kernels/context.hpp"
#include "offload/swap_policy.hpp"

namespace spillway::examples {

struct parameter;

// Note [Overlapped gradient exchange]
// Under --data-parallel the backward pass hands over each parameter's gradient as soon as it is
// final (parameter_set::gradient_ready, which the models' passes call after the op that last
// writes it). An op "<name>.grad.stage" copies the gradient (widened to fp32 in bf16) into this
// rank's pinned host reduction buffer, in stream order after that op. Parameters join the open
// bucket until it holds bucket_bytes; the bucket is then queued on the collective stream behind
// an event on the compute stream (Note [Collective streams] in comm/collective_stream.hpp), whose
// thread sums each of its parameters over the ranks (all-reduce under ZeRO 1; under ZeRO 2 a
// reduce-scatter that leaves the parameter's shard) while the device goes on with the backward
// pass. The last bucket is queued when the pass ends. Then, for each parameter, last registered
// first, the issuing thread waits for its bucket only, and issues "<name>.grad.mean": the reduced
// shard copied back, times 1/N, into the gradient's shard in its own format (through an fp32
// workspace in bf16), which Adam reads. Every sum is the communicator's (Note [Fixed-order
// reductions]): element by element in rank order, whatever the buckets, so the bits are those of
// Note [Micro-batches]. The reduction buffer is the rank's, outside the Session (as NCCL's
// buffers are), so no Session tensor is held by a collective in flight: staging is ordinary
// stream work, and the copy back is issued only after its bucket has been waited for.
// The updated weights travel the same way: after a parameter's Adam step, "<name>.gather.stage"
// copies this rank's shard of the new weights into a second pinned buffer, buckets of them are
// all-gathered on the collective stream while the other parameters' steps run, and at the end of
// the step "<name>.gather.load" waits for its bucket and copies the whole gathered weights back
// (a write of all of them), before the next step's forward pass reads them.
class gradient_exchange {
 public:
  /// Counts over the steps so far.
  struct stats {
    std::uint64_t buckets = 0;              ///< buckets queued
    std::uint64_t buckets_in_backward = 0;  ///< of them, queued before the backward pass had ended
    std::uint64_t staged_in_backward = 0;   ///< gradients the passes handed over
    std::uint64_t staged_after = 0;         ///< gradients no pass handed over, staged after it
  };

  /// For the parameters `params` (all of the set, with their index and shard); shares.comm must
  /// be the job's communicator.
  gradient_exchange(Device& device, const batch_shares& shares, precision prec, const std::vector<parameter>& params);
  ~gradient_exchange();
  gradient_exchange(const gradient_exchange&) = delete;
  gradient_exchange& operator=(const gradient_exchange&) = delete;

  /// Before a step's pass: no gradient staged yet.
  void begin_step();
  /// Stages parameter `p`'s gradient and queues the open bucket once it is full; usage_error when
  /// `p` was staged already this step.
  void stage(Session& s, kernels::kernel_context& ctx, const parameter& p);
  /// After the pass: stages what the pass did not hand over and queues the last bucket.
  void end_backward(Session& s, kernels::kernel_context& ctx, const std::vector<parameter>& params);
  /// Waits for `p`'s bucket and writes the mean of its shard into its gradient ("<name>.grad.mean").
  void finish(Session& s, kernels::kernel_context& ctx, const parameter& p);
  /// After `p`'s Adam step: stages this rank's shard of its new weights for the all-gather.
  void stage_update(Session& s, const parameter& p);
  /// After every stage_update: queues the last bucket of weights.
  void end_updates();
  /// Waits for `p`'s weights bucket and writes the gathered weights ("<name>.gather.load").
  void load_update(Session& s, const parameter& p);
  /// Waits for every queued bucket (before the caller uses the communicator itself).
  void wait_all();
  [[nodiscard]] stats counts() const noexcept { return stats_; }

 private:
  void queue_bucket();
  void queue_gather();

  struct slot {
    std::size_t offset = 0;  ///< in floats, into host_
    std::size_t count = 0;
    std::size_t shard_first = 0;
    std::size_t shard_count = 0;
  };

  Device* device_;
  std::shared_ptr<comm::communicator> comm_;
  int zero_;
  precision prec_;
  std::uint64_t bucket_limit_;
  std::vector<slot> slots_;
  std::vector<comm::collective_stream::ticket> ticket_;  // per parameter: its bucket (0: not queued)
  std::vector<bool> staged_;
  float* host_ = nullptr;  // pinned, every gradient in fp32, at slots_[i].offset
  std::size_t host_floats_ = 0;
  std::vector<std::size_t> bucket_;  // indices of the open bucket
  std::uint64_t bucket_bytes_ = 0;
  std::size_t elem_bytes_;             // of the weights: 4, or 2 in bf16
  std::byte* host_values_ = nullptr;   // pinned, every parameter's weights, at slots_[i].offset elements
  std::vector<comm::collective_stream::ticket> gather_ticket_;
  std::vector<std::size_t> gather_bucket_;
  std::uint64_t gather_bytes_ = 0;
  stream last_stream_{};
  bool have_stream_ = false;
  bool in_backward_ = false;
  stats stats_;
  std::unique_ptr<comm::collective_stream> stream_;  // last member: its thread goes first
};

}  // namespace spillway::examples
