// kernel_context in a build with CUDA: on the cuda backend it owns a cuBLAS handle, a cuDNN
// handle and the pool of report slots (Note [Reports from kernels]); on the cpu backend it holds
// none of them. The workspace is the caller's (Note [Workspace]).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <mutex>
#include <optional>
#include <vector>

#include "device/cuda_check.hpp"
#include "device/error.hpp"
#include "kernels/context.hpp"
#include "kernels/cuda_library_check.hpp"

namespace spillway::kernels {
namespace detail {
namespace {

/// One page of pinned host memory holding report slots, mapped for the GPU.
struct report_page {
  static constexpr std::size_t bytes = 4096;
  static constexpr std::size_t slots = bytes / (2 * sizeof(std::int32_t));
  void* host = nullptr;
  std::int32_t* device = nullptr;
  std::unique_ptr<std::atomic<bool>[]> busy = std::make_unique<std::atomic<bool>[]>(slots);
};

}  // namespace

/// The report slots of one context (Note [Reports from kernels]). take() runs on the threads that
/// launch, under a mutex (a context may be shared by threads launching on their own streams); a
/// host function frees its slot from the callback thread (the busy flags are atomic, the pages
/// never move while the pool lives).
class report_pool {
 public:
  explicit report_pool(Device& device) : device_(device) {}
  ~report_pool() {
    if (pages_.empty()) return;
    try {
      device_.synchronize();  // no host function left that reads a page, no kernel that writes one
    } catch (...) {  // NOLINT(bugprone-empty-catch): a failed device has run what it will run
    }
    for (const auto& p : pages_) device_.deallocate_pinned(p->host, report_page::bytes);
  }
  report_pool(const report_pool&) = delete;
  report_pool& operator=(const report_pool&) = delete;

  kernel_report take() {
    const std::lock_guard lock(mutex_);
    const std::size_t total = pages_.size() * report_page::slots;
    for (std::size_t k = 0; k < total; ++k) {
      const std::size_t at = (next_ + k) % total;
      if (auto r = try_take(at)) return *r;
    }
    add_page();
    const std::size_t at = total;  // the new page's first slot
    return *try_take(at);
  }

 private:
  std::optional<kernel_report> try_take(std::size_t at) {
    report_page& p = *pages_[at / report_page::slots];
    const std::size_t i = at % report_page::slots;
    if (p.busy[i].exchange(true, std::memory_order_acquire)) return std::nullopt;
    next_ = at + 1;
    return kernel_report{p.device + 2 * i, static_cast<const volatile std::int32_t*>(p.host) + 2 * i, &p.busy[i]};
  }
  void add_page() {
    auto p = std::make_unique<report_page>();
    p->host = device_.allocate_pinned(report_page::bytes);
    // The Device registers pinned memory with cudaHostRegisterDefault, which maps it for the GPU
    // (every 64-bit build has unified addressing); this is the address kernels write through.
    void* dev = nullptr;
    device_.make_current();
    const cudaError_t status = cudaHostGetDevicePointer(&dev, p->host, 0);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      device_.deallocate_pinned(p->host, report_page::bytes);
      ::spillway::detail::throw_cuda(status, "cudaHostGetDevicePointer", __FILE__, __LINE__);
    }
    p->device = static_cast<std::int32_t*>(dev);
    pages_.push_back(std::move(p));
  }

  Device& device_;
  std::vector<std::unique_ptr<report_page>> pages_;
  std::size_t next_ = 0;
  std::mutex mutex_;  // take()
};

struct cuda_handles {
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  std::unique_ptr<report_pool> reports;

  ~cuda_handles() {
    reports.reset();  // first: it waits for the device, before the handles go
    if (cudnn != nullptr) (void)cudnnDestroy(cudnn);
    if (cublas != nullptr) (void)cublasDestroy(cublas);
  }
};

}  // namespace detail

kernel_context::kernel_context(Device& device) : device_(&device), backend_(device.properties().backend) {
  if (backend_ != spillway::backend::cuda) return;
  // Handles belong to the thread's current GPU, which is GPU 0 on a new thread.
  device.make_current();
  auto h = std::make_unique<detail::cuda_handles>();
  SPILLWAY_CUBLAS_TRY(cublasCreate(&h->cublas));
  // Note [Deterministic kernels]: no atomics inside cuBLAS either.
  SPILLWAY_CUBLAS_TRY(cublasSetAtomicsMode(h->cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
  // Default math (no TF32), and a bf16 GEMM with a bf16 C keeps every partial sum in float32,
  // split-k reductions included: by default cuBLAS may reduce those in the output type.
  SPILLWAY_CUBLAS_TRY(cublasSetMathMode(h->cublas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  // Note [Workspace]: cuBLAS works only in the workspace the caller binds, never in a default
  // pool of its own outside the budget. Each GEMM sets it again (cublasSetStream resets it).
  SPILLWAY_CUBLAS_TRY(cublasSetWorkspace(h->cublas, nullptr, 0));
  SPILLWAY_CUDNN_TRY(cudnnCreate(&h->cudnn));
  h->reports = std::make_unique<detail::report_pool>(device);
  cuda_ = std::move(h);
}

kernel_context::~kernel_context() = default;

void* kernel_context::cublas_handle() const {
  SPILLWAY_EXPECTS_T(usage_error, cuda_ != nullptr, "cublas_handle: the context is not on the cuda backend");
  device_->make_current();  // a library call runs on the thread's current GPU
  return cuda_->cublas;
}

void* kernel_context::cudnn_handle() const {
  SPILLWAY_EXPECTS_T(usage_error, cuda_ != nullptr, "cudnn_handle: the context is not on the cuda backend");
  device_->make_current();
  return cuda_->cudnn;
}

detail::kernel_report kernel_context::take_report() {
  SPILLWAY_EXPECTS_T(usage_error, cuda_ != nullptr, "take_report: the context is not on the cuda backend");
  return cuda_->reports->take();
}

}  // namespace spillway::kernels
