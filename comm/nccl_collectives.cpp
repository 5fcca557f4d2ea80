// comm/: NCCL collectives on device memory: grouped sends and receives per peer into the owner's
// staging, then the rank-order sum kernel; all-gathers as bytes (ncclAllGather when even).
#include "comm/nccl_collectives.hpp"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "comm/checks.hpp"
#include "comm/comm_error.hpp"
#include "comm/communicator.hpp"
#include "comm/mpi_requests.hpp"
#include "comm/nccl_sum.hpp"
#include "device/cuda_check.hpp"

namespace spillway::comm {

namespace {

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
  comm_options options;
  std::string failed;  // the first comm_error's text; empty while healthy (Note [NCCL faults])

  [[nodiscard]] std::string rank_text() const {
    return " [this is rank " + std::to_string(rank) + " of " + std::to_string(size) + "]";
  }
  /// Fails the object for good with `msg` and throws it.
  [[noreturn]] void fail(std::string msg) {
    if (failed.empty()) failed = msg;
    throw comm_error(std::move(msg));
  }
  /// Throws comm_error "WHAT: CALL: <NCCL's text>" when rc is not ncclSuccess, failing the object.
  void check(ncclResult_t rc, const char* what, const char* call) {
    if (rc != ncclSuccess) fail(std::string(what) + ": " + call + ": " + ncclGetErrorString(rc) + rank_text());
  }
  void refuse_if_failed(const char* what) const {
    if (failed.empty()) return;
    throw comm_error(std::string(what) + ": the NCCL communicator failed earlier (" + failed +
                     "); the ranks no longer agree on which collective comes next: end the job "
                     "(communicator::abort)");
  }
  /// Stops NCCL's work on every rank's side of this communicator, spinning kernels included.
  void abort() noexcept {
    if (comm == nullptr) return;
    (void)ncclCommAbort(comm);
    comm = nullptr;
  }
  [[noreturn]] void abort_and_fail(const char* what, const std::string& cause) {
    abort();
    fail(std::string(what) + ": " + cause + "; the NCCL communicator was aborted: end the job (communicator::abort)" +
         rank_text());
  }

  /// ncclGroupStart .. ncclGroupEnd as a scope. NCCL keeps the group depth per thread: a group
  /// left open by an exception would queue every later NCCL call of this thread, on any
  /// communicator, and launch none of it, so the ranks would hang. On unwind the scope ends the
  /// group and fails the object: NCCL drops a group in which one of its calls failed (every
  /// throw inside one comes from such a call, through check()), and either way the peers now
  /// wait for sends and receives that may never come.
  class group {
   public:
    group(impl& owner, const char* what) : owner_(owner), what_(what) {
      owner_.check(ncclGroupStart(), what_, "ncclGroupStart");
    }
    ~group() {
      if (!open_) return;
      (void)ncclGroupEnd();
      try {
        if (owner_.failed.empty())
          owner_.failed = std::string(what_) + ": a grouped send or receive failed" + owner_.rank_text();
      } catch (...) {  // no memory for the text: the failure itself is what is being thrown
      }
    }
    group(const group&) = delete;
    group& operator=(const group&) = delete;

    void end() {
      open_ = false;
      owner_.check(ncclGroupEnd(), what_, "ncclGroupEnd");
    }

   private:
    impl& owner_;
    const char* what_;
    bool open_ = true;
  };
};

nccl_collectives::nccl_collectives(communicator& host, int cuda_device, comm_options options)
    : impl_(std::make_unique<impl>()) {
  impl_->rank = host.rank();
  impl_->size = host.size();
  impl_->device = cuda_device;
  impl_->options = options;
  ncclUniqueId id{};
  if (impl_->rank == 0) impl_->check(ncclGetUniqueId(&id), "nccl_collectives", "ncclGetUniqueId");
  host.broadcast(&id, sizeof id, 0);
  device_scope scope(cuda_device);
  impl_->check(ncclCommInitRank(&impl_->comm, impl_->size, id, impl_->rank), "nccl_collectives",
               "ncclCommInitRank");
}

nccl_collectives::~nccl_collectives() {
  if (!impl_ || impl_->comm == nullptr) return;
  // ncclCommDestroy waits for the work still queued, for ever where a peer is gone: a failed
  // communicator, or one with an asynchronous error pending, is aborted (Note [NCCL faults]).
  ncclResult_t async = ncclSuccess;
  const bool healthy = impl_->failed.empty() && ncclCommGetAsyncError(impl_->comm, &async) == ncclSuccess &&
                       async == ncclSuccess;
  if (healthy)
    (void)ncclCommDestroy(impl_->comm);
  else
    impl_->abort();
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
  impl_->refuse_if_failed(what);
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
  impl::group group(*impl_, what);
  for (int peer = 0; peer < impl_->size; ++peer) {
    if (peer == impl_->rank) continue;
    const auto [pb, pe] = shard_range(n, impl_->size, peer);
    impl_->check(ncclSend(in + pb, pe - pb, ncclFloat, peer, impl_->comm, stream), what, "ncclSend");
    impl_->check(ncclRecv(staging + static_cast<std::size_t>(peer) * mine, mine, ncclFloat, peer,
                          impl_->comm, stream),
                 what, "ncclRecv");
  }
  group.end();
  detail::launch_fixed_order_sum(staging, in + b, impl_->rank, impl_->size, out, mine, stream);
}

void nccl_collectives::all_reduce_sum(float* data, std::size_t n, void* workspace,
                                      cudaStream_t stream) {
  detail::check_all_reduce(data, n);
  impl_->refuse_if_failed("nccl all_reduce_sum");
  const auto [b, e] = shard_range(n, impl_->size, impl_->rank);
  // The sends read the other shards; the kernel writes only ours, after the receives.
  reduce_scatter_sum(data, data + b, n, workspace, stream);
  all_gather(data + b, data, n, sizeof(float), stream);
}

void nccl_collectives::all_gather(const void* shard, void* out, std::size_t n,
                                  std::size_t elem_bytes, cudaStream_t stream) {
  const char* what = "nccl all_gather";
  detail::check_all_gather(shard, out, n, elem_bytes, impl_->size, impl_->rank);
  impl_->refuse_if_failed(what);
  const auto [b, e] = shard_range(n, impl_->size, impl_->rank);
  auto* dst = static_cast<char*>(out);
  const auto* src = static_cast<const char*>(shard);
  const std::size_t mine = (e - b) * elem_bytes;
  device_scope scope(impl_->device);
  const auto k = static_cast<std::size_t>(impl_->size);
  if (impl_->size > 1 && n % k == 0) {
    // Equal shards: NCCL's own all-gather (in place when shard is out's own place).
    impl_->check(ncclAllGather(src, dst, mine, ncclChar, impl_->comm, stream), what, "ncclAllGather");
    return;
  }
  if (impl_->size > 1) {
    impl::group group(*impl_, what);
    for (int peer = 0; peer < impl_->size; ++peer) {
      if (peer == impl_->rank) continue;
      const auto [pb, pe] = shard_range(n, impl_->size, peer);
      if (mine > 0) impl_->check(ncclSend(src, mine, ncclChar, peer, impl_->comm, stream), what, "ncclSend");
      if (pe > pb)
        impl_->check(ncclRecv(dst + pb * elem_bytes, (pe - pb) * elem_bytes, ncclChar, peer,
                              impl_->comm, stream),
                     what, "ncclRecv");
    }
    group.end();
  }
  if (dst + b * elem_bytes != src && mine > 0)
    SPILLWAY_CUDA_TRY(cudaMemcpyAsync(dst + b * elem_bytes, src, mine, cudaMemcpyDeviceToDevice, stream));
}

void nccl_collectives::synchronize(cudaStream_t stream) {
  const char* what = "nccl synchronize";
  impl_->refuse_if_failed(what);
  device_scope scope(impl_->device);
  cudaEvent_t reached = nullptr;
  SPILLWAY_CUDA_TRY(cudaEventCreateWithFlags(&reached, cudaEventDisableTiming));
  struct event_owner {
    cudaEvent_t e;
    ~event_owner() { (void)cudaEventDestroy(e); }
  } owner{reached};
  SPILLWAY_CUDA_TRY(cudaEventRecord(reached, stream));
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const std::chrono::milliseconds timeout = impl_->options.timeout;
  // NCCL's own error first, then the stream's: a kernel that NCCL stopped after a failure also
  // completes the event, and its output is not the sum.
  const auto check_async = [&] {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(impl_->comm, &async);
    if (rc != ncclSuccess)
      impl_->abort_and_fail(what, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(rc));
    if (async != ncclSuccess && async != ncclInProgress)
      impl_->abort_and_fail(what, std::string("NCCL reported ") + ncclGetErrorString(async) +
                                      " (a rank failed or was killed, or the network between the ranks broke)");
  };
  for (int idle = 0;; ++idle) {
    check_async();
    const cudaError_t status = cudaEventQuery(reached);
    if (status == cudaSuccess) break;
    if (status != cudaErrorNotReady) {
      // The stream failed: its collectives may never have run, and the peers wait for them.
      impl_->abort();
      if (impl_->failed.empty())
        impl_->failed = std::string(what) + ": the stream failed: " + cudaGetErrorName(status) + impl_->rank_text();
      SPILLWAY_CUDA_TRY(status);
    }
    (void)cudaGetLastError();  // "not ready" is an answer, not an error: leave no trace of it
    if (timeout.count() > 0 && clock::now() - start >= timeout)
      impl_->abort_and_fail(what, "the collectives on this stream did not finish within " +
                                      detail::duration_text(timeout) +
                                      " (a rank failed, was killed, or is stuck; a rank that is only slow, "
                                      "in a long checkpoint save, needs a longer comm_options::timeout)");
    // Spin briefly, then back off to at most 200 us so a long wait does not take a core from
    // the ranks sharing it (as the host collectives wait, Note [Waiting with a timeout]).
    if (idle > 64)
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(idle - 64, 200)));
    else
      std::this_thread::yield();
  }
  check_async();
}

}  // namespace spillway::comm
