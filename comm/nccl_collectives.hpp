// comm/: collectives on device memory over NCCL, on a stream the caller orders by events like its
// copies, with the same fixed-order sums as the host collectives (Note [Fixed-order reductions]).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

namespace spillway::comm {

class communicator;

/// One NCCL communicator over the ranks of a host communicator, on one CUDA device.
/// Calls only enqueue work on `stream` (like cudaMemcpyAsync): the result is there once the
/// stream reaches that point. Every rank enqueues the same collectives in the same order.
/// Sums: each rank sends every peer that peer's shard (ncclSend/ncclRecv, grouped) into the
/// owner's staging, [N][shard] floats, and a kernel adds the N parts in rank order with
/// round-to-nearest adds that are never fused; all-gathers copy bytes. The staging is the
/// caller's (`workspace`, workspace_bytes(n) bytes of device memory), so it is counted in the
/// caller's budget and allocator like any other device memory.
/// Faults: NCCL errors throw comm_error; a peer that never joins is NCCL's to report (this class
/// adds no timeout of its own: the host communicator's barrier around steps bounds a run).
class nccl_collectives {
 public:
  /// Collective over `host` (it carries NCCL's unique id from rank 0): every rank calls it, each
  /// with its own GPU `cuda_device`. One GPU cannot host two ranks of one NCCL communicator.
  nccl_collectives(communicator& host, int cuda_device);
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

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace spillway::comm
