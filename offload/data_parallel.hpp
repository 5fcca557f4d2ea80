// Data parallel with a sharded optimizer (ZeRO stages 1 and 2) as a trace transform: one rank's
// trace from the one-process trace, with its collectives on the network stream (collective.hpp).
#pragma once

#include <cstdint>
#include <string_view>

#include "offload/collective.hpp"
#include "prefetch/trace.hpp"

namespace spillway::offload {

/// Note [Data parallel]
/// N ranks each run the one-process trace on their own micro-batch: the per-rank batch stays
/// what the trace was made with, so the global batch is N times it (weak scaling; the scaling
/// efficiency of N ranks is the one-rank step over the N-rank step). make_rank_trace rewrites
/// the trace the way ZeRO runs it on every rank:
///  - The optimizer ops (op_phase::optimizer) update 1/N of the model: their flops, kernel bytes
///    and host cost shrink to 1/N, every optimizer_state tensor (Adam moments, fp32 master
///    weights) shrinks to ceil(bytes / N), and a parameter they read or write becomes its shard
///    '<w>.shard' (ceil(bytes / N), a parameter).
///  - Stage 2: a gradient the backward pass writes becomes a transient buffer (an activation:
///    written by the backward pass, dead after its reduce-scatter), and a reduce-scatter writes
///    its 1/N shard '<g>.shard' (a gradient), which the optimizer ops read instead. Stage 1: an
///    all-reduce reads the gradient and writes the shard (the gradient stays a gradient, whole).
///    Gradients go in buckets of at least bucket_bytes in the order the backward pass finishes
///    them; a bucket's collective follows the op that finishes its last gradient (or comes
///    sooner, right before an op that reads one of its shards).
///  - An optimizer op that writes a transient value (the global norm of clipping) wrote a
///    partial sum over the rank's shard: an all-reduce of it follows the op.
///  - Each parameter an optimizer op writes is all-gathered from the shards, in buckets, before
///    it is next read: gather_placement::before_use puts the buckets at the start of the
///    iteration in the order the forward pass first reads them, each `gather_ahead` buckets
///    before the first op that reads it (the next iteration reads what this one's shards hold:
///    the shard crosses the iteration boundary, the whole parameter no longer does);
///    after_step puts each bucket right after the optimizer op that writes its last shard, as
///    DeepSpeed does.
///  - early_step_share: the optimizer ops of that share of the parameter bytes (the parameters
///    the forward pass reads last, whose gradients the backward pass finishes first) run in the
///    backward pass, each right before the collective of the bucket early_step_lag buckets after
///    the one that reduces the last of its gradients (later, so that the compute stream does
///    not wait for the collective; the last buckets' steps where the optimizer ops are), and
///    their parameters are all-gathered (in buckets) right after them: the network carries
///    those gathers while the backward pass still computes, not in the next forward pass. An
///    op moves only when it reads nothing another optimizer op writes (not with clipping, whose
///    norm needs every gradient) and nothing reads its parameters after their gradients are
///    finished; the values are those of the step in place (the reduced gradient is complete).
/// One rank (N = 1) is the plain run: the trace comes back unchanged, with no collectives.
/// A shard of ceil(bytes / N) is rank 0's, the largest; every rank's trace is that one.
enum class zero_stage : std::uint8_t { one = 1, two = 2 };
enum class gather_placement : std::uint8_t { before_use, after_step };
[[nodiscard]] std::string_view to_string(gather_placement g) noexcept;

struct data_parallel_options {
  std::uint32_t ranks = 1;
  zero_stage stage = zero_stage::two;
  /// Least bytes of gradient (or parameter) in one collective (DeepSpeed's reduce_bucket_size
  /// is 5e8 elements; PyTorch DDP's bucket 25 MiB): fewer, larger collectives pay less latency.
  std::uint64_t bucket_bytes = 200'000'000;
  gather_placement gather = gather_placement::before_use;
  std::uint32_t gather_ahead = 2;  ///< before_use: buckets gathered ahead of the one being read
  double early_step_share = 0;     ///< 0..1: parameter bytes stepped and gathered in the backward pass
  std::uint32_t early_step_lag = 8;  ///< an early step waits for this many buckets after its gradients' (>= 1)
};

/// One rank's trace and the collectives in it.
struct rank_trace {
  trace t;
  comm_schedule comm;
};

/// The trace one of `o.ranks` ranks runs (Note [Data parallel]). Throws config_error when ranks
/// is 0, bucket_bytes is 0 or early_step_share is not in [0, 1], or when a gradient is read before the backward pass writes it
/// (naming the tensor and the op).
rank_trace make_rank_trace(const trace& t, const data_parallel_options& o);

}  // namespace spillway::offload
