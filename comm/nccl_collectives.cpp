// comm/: NCCL collectives on device memory: grouped sends and receives per peer into the owner's
// staging, then the rank-order sum kernel; all-gathers as bytes (ncclAllGather when even).
#include "comm/nccl_collectives.hpp"

#include <nccl.h>

#include <string>

#include "comm/checks.hpp"
#include "comm/comm_error.hpp"
#include "comm/communicator.hpp"
#include "comm/nccl_sum.hpp"
#include "device/cuda_check.hpp"

namespace spillway::comm {

namespace {

void check_nccl(ncclResult_t rc, const char* what, const char* call) {
  if (rc != ncclSuccess)
    throw comm_error(std::string(what) + ": " + call + ": " + ncclGetErrorString(rc));
}

/// Makes `device` current for a scope and restores the caller's.
class device_scope {
 public:
  explicit device_scope(int device) {
    SPILLWAY_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device) SPILLWAY_CUDA_TRY(cudaSetDevice(device));
  }
  ~device_scope() { cudaSetDevice(previous_); }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

struct nccl_collectives::impl {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
};

nccl_collectives::nccl_collectives(communicator& host, int cuda_device) : impl_(std::make_unique<impl>()) {
  impl_->rank = host.rank();
  impl_->size = host.size();
  impl_->device = cuda_device;
  ncclUniqueId id{};
  if (impl_->rank == 0) check_nccl(ncclGetUniqueId(&id), "nccl_collectives", "ncclGetUniqueId");
  host.broadcast(&id, sizeof id, 0);
  device_scope scope(cuda_device);
  check_nccl(ncclCommInitRank(&impl_->comm, impl_->size, id, impl_->rank), "nccl_collectives",
             "ncclCommInitRank");
}

nccl_collectives::~nccl_collectives() {
  if (impl_ && impl_->comm != nullptr) ncclCommDestroy(impl_->comm);
}

int nccl_collectives::rank() const noexcept { return impl_->rank; }
int nccl_collectives::size() const noexcept { return impl_->size; }
int nccl_collectives::cuda_device() const noexcept { return impl_->device; }

std::size_t nccl_collectives::workspace_bytes(std::size_t n) const noexcept {
  if (impl_->size == 1) return 0;
  const auto k = static_cast<std::size_t>(impl_->size);
  return (n + k - 1) / k * k * sizeof(float);  // [N][largest shard]
}

void nccl_collectives::reduce_scatter_sum(const float* in, float* out, std::size_t n,
                                          void* workspace, cudaStream_t stream) {
  const char* what = "nccl reduce_scatter_sum";
  detail::check_reduce_scatter(in, out, n, impl_->size, impl_->rank);
  const auto [b, e] = shard_range(n, impl_->size, impl_->rank);
  const std::size_t mine = e - b;
  device_scope scope(impl_->device);
  if (impl_->size == 1) {
    if (out != in && n > 0)
      SPILLWAY_CUDA_TRY(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  SPILLWAY_EXPECTS_T(usage_error, workspace != nullptr || n == 0,
                     std::string(what) + ": workspace is null (it needs workspace_bytes(n))");
  auto* staging = static_cast<float*>(workspace);
  check_nccl(ncclGroupStart(), what, "ncclGroupStart");
  for (int peer = 0; peer < impl_->size; ++peer) {
    if (peer == impl_->rank) continue;
    const auto [pb, pe] = shard_range(n, impl_->size, peer);
    check_nccl(ncclSend(in + pb, pe - pb, ncclFloat, peer, impl_->comm, stream), what, "ncclSend");
    check_nccl(ncclRecv(staging + static_cast<std::size_t>(peer) * mine, mine, ncclFloat, peer,
                        impl_->comm, stream),
               what, "ncclRecv");
  }
  check_nccl(ncclGroupEnd(), what, "ncclGroupEnd");
  detail::launch_fixed_order_sum(staging, in + b, impl_->rank, impl_->size, out, mine, stream);
}

void nccl_collectives::all_reduce_sum(float* data, std::size_t n, void* workspace,
                                      cudaStream_t stream) {
  detail::check_all_reduce(data, n);
  const auto [b, e] = shard_range(n, impl_->size, impl_->rank);
  // The sends read the other shards; the kernel writes only ours, after the receives.
  reduce_scatter_sum(data, data + b, n, workspace, stream);
  all_gather(data + b, data, n, sizeof(float), stream);
}

void nccl_collectives::all_gather(const void* shard, void* out, std::size_t n,
                                  std::size_t elem_bytes, cudaStream_t stream) {
  const char* what = "nccl all_gather";
  detail::check_all_gather(shard, out, n, elem_bytes, impl_->size, impl_->rank);
  const auto [b, e] = shard_range(n, impl_->size, impl_->rank);
  auto* dst = static_cast<char*>(out);
  const auto* src = static_cast<const char*>(shard);
  const std::size_t mine = (e - b) * elem_bytes;
  device_scope scope(impl_->device);
  const auto k = static_cast<std::size_t>(impl_->size);
  if (impl_->size > 1 && n % k == 0) {
    // Equal shards: NCCL's own all-gather (in place when shard is out's own place).
    check_nccl(ncclAllGather(src, dst, mine, ncclChar, impl_->comm, stream), what, "ncclAllGather");
    return;
  }
  if (impl_->size > 1) {
    check_nccl(ncclGroupStart(), what, "ncclGroupStart");
    for (int peer = 0; peer < impl_->size; ++peer) {
      if (peer == impl_->rank) continue;
      const auto [pb, pe] = shard_range(n, impl_->size, peer);
      if (mine > 0) check_nccl(ncclSend(src, mine, ncclChar, peer, impl_->comm, stream), what, "ncclSend");
      if (pe > pb)
        check_nccl(ncclRecv(dst + pb * elem_bytes, (pe - pb) * elem_bytes, ncclChar, peer,
                            impl_->comm, stream),
                   what, "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), what, "ncclGroupEnd");
  }
  if (dst + b * elem_bytes != src && mine > 0)
    SPILLWAY_CUDA_TRY(cudaMemcpyAsync(dst + b * elem_bytes, src, mine, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace spillway::comm
