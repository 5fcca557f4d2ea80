// comm/: collectives on device memory over NCCL, on a stream the caller orders by events like its
// copies, with the same fixed-order sums as the host collectives (Note [Fixed-order reductions]).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "comm/communicator.hpp"

namespace spillway::comm {

/// One NCCL communicator over the ranks of a host communicator, on one CUDA device.
/// Calls only enqueue work on `stream` (like cudaMemcpyAsync): the result is there once the
/// stream reaches that point. Every rank enqueues the same collectives in the same order.
/// Sums: each rank sends every peer that peer's shard (ncclSend/ncclRecv, grouped) into the
/// owner's staging, [N][shard] floats, and a kernel adds the N parts in rank order with
/// round-to-nearest adds that are never fused; all-gathers copy bytes. The staging is the
/// caller's (`workspace`, workspace_bytes(n) bytes of device memory), so it is counted in the
/// caller's budget and allocator like any other device memory.
/// One thread at a time uses an object (the jobs of a collective_stream are its only callers).
///
/// Note [NCCL faults]
/// A call throws comm_error when NCCL refuses the work it enqueues. A peer that fails, is killed
/// or hangs once the work is enqueued is another matter: the communicator is blocking, so no
/// call returns that failure; NCCL's kernels on `stream` spin, waiting for the peer, and the
/// error shows only through ncclCommGetAsyncError. cudaStreamSynchronize (or an event wait) on
/// that stream would then never return, nor would ncclCommDestroy, which waits for the work
/// still queued. synchronize(stream) is the wait that ends: it polls the stream and NCCL's
/// asynchronous error, and on an error, or after comm_options::timeout, it aborts the
/// communicator (ncclCommAbort, which also stops the spinning kernels) and throws comm_error.
/// After any comm_error the object is failed for good, as a host communicator is: every later
/// call throws it again (the ranks no longer agree on which collective comes next), and the
/// destructor aborts the NCCL communicator instead of destroying it. The destructor of an object
/// that never failed still uses ncclCommDestroy, so call synchronize() before it.
class nccl_collectives {
 public:
  /// Collective over `host` (it carries NCCL's unique id from rank 0): every rank calls it, each
  /// with its own GPU `cuda_device`. One GPU cannot host two ranks of one NCCL communicator.
  /// options.timeout bounds synchronize() (pass the host communicator's; 0 waits for ever).
  nccl_collectives(communicator& host, int cuda_device, comm_options options = {});
  ~nccl_collectives();
  nccl_collectives(const nccl_collectives&) = delete;
  nccl_collectives& operator=(const nccl_collectives&) = delete;

  [[nodiscard]] int rank() const noexcept;
  [[nodiscard]] int size() const noexcept;
  [[nodiscard]] int cuda_device() const noexcept;

  /// Device workspace reduce_scatter_sum and all_reduce_sum need for n elements (0 on one rank).
  [[nodiscard]] std::size_t workspace_bytes(std::size_t n) const noexcept;
  /// out (device, this rank's shard_range(n, size(), rank())) = the sum over ranks of in (device).
  void reduce_scatter_sum(const float* in, float* out, std::size_t n, void* workspace,
                          cudaStream_t stream);
  /// data (device, n on every rank) = the sum over ranks, the same bits on every rank.
  void all_reduce_sum(float* data, std::size_t n, void* workspace, cudaStream_t stream);
  /// out (device, n elements of elem_bytes) = every rank's shard in rank order; `shard` may point
  /// into out at this rank's place.
  void all_gather(const void* shard, void* out, std::size_t n, std::size_t elem_bytes,
                  cudaStream_t stream);
  /// Returns once the work enqueued on `stream` so far (the collectives among it) has finished.
  /// comm_error, with the NCCL communicator aborted, when NCCL reports a failure meanwhile or
  /// options.timeout passes first (Note [NCCL faults]).
  void synchronize(cudaStream_t stream);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace spillway::comm
