// kernel_context: what every kernel launch needs besides its stream — the Device, its backend,
// and on the cuda backend the cuBLAS and cuDNN handles and a device workspace for cuDNN.
//
// Launch contract, shared by every kernel in kernels/:
//  * A kernel is enqueued on the stream it is given and returns at once. Pointers name device
//    memory of ctx.device() (on the cpu backend that is host memory from Device::allocate, but
//    any host memory works there); they must stay valid until the stream reaches the kernel.
//  * cpu backend: the work runs on the stream's own thread via Device::launch_host, with oneTBB
//    for parallel loops inside. Errors found there are sticky and rethrown by the next
//    synchronize of the stream. cuda backend: the kernel is launched on (cudaStream_t)s.handle.
//  * Layouts are row-major: a matrix [rows, cols] has element (r, c) at r * cols + c. Images are
//    NCHW. Everything is float32; token ids and class targets are int32.
//  * Determinism: see Note [Deterministic kernels] below.
//  * A context is used from one host thread at a time (cuBLAS and cuDNN handles are not
//    thread-safe); make one context per thread that launches.
//
// Note [Deterministic kernels]
// Invariant 1 (swapping never changes results) needs every kernel to give the same bits for
// the same inputs on every run, whatever the buffer addresses and the thread timing. So:
//  * cpu: parallel loops (oneTBB, simple_partitioner, fixed grain) split over independent
//    outputs only; every sum (row statistics, column sums for bias/gamma/beta gradients, the
//    embedding scatter-add, conv's dw over images and col2im) runs serially in a fixed order
//    inside one task. GEMM is OpenBLAS, which splits work over threads by output tiles, never
//    along k, and packs its operands, so alignment does not change the arithmetic either.
//    (Bits can differ between machines or OPENBLAS_NUM_THREADS settings; within one setup they
//    repeat.)
//  * cuda: reductions are fixed shared-memory trees in blocks of a fixed size, or one thread
//    walking its column in order; no float atomics. cuBLAS runs with atomics disallowed;
//    cuDNN uses fixed deterministic algorithms (no autotuning) and FMA math (no TF32).
//    cuBLAS and cuDNN may pick kernels by pointer alignment, so on the GPU the promise holds
//    for buffers whose addresses agree modulo 256 bytes between runs (every allocation from
//    Device::allocate and the caching allocator is 256-byte aligned).
#pragma once

#include <cstddef>
#include <memory>

#include "device/device.hpp"

namespace spillway::kernels {

namespace detail {
struct cuda_handles;  // defined in context_cuda.cpp, only in builds with CUDA
}

class kernel_context {
 public:
  explicit kernel_context(Device& device);
  ~kernel_context();
  kernel_context(const kernel_context&) = delete;
  kernel_context& operator=(const kernel_context&) = delete;

  [[nodiscard]] Device& device() const noexcept { return *device_; }
  [[nodiscard]] spillway::backend backend() const noexcept { return backend_; }
  [[nodiscard]] bool is_cuda() const noexcept { return backend_ == spillway::backend::cuda; }

  /// cuda backend only: the handles, as opaque pointers (cublasHandle_t, cudnnHandle_t).
  [[nodiscard]] void* cublas_handle() const;
  [[nodiscard]] void* cudnn_handle() const;

  /// cuda backend only: device scratch of at least `bytes`, usable by work enqueued on `s`
  /// until the next call. Growing it waits for the device first, so old work is done with it.
  [[nodiscard]] void* workspace(std::size_t bytes, stream s);

 private:
  Device* device_;
  spillway::backend backend_;
  std::unique_ptr<detail::cuda_handles> cuda_;
};

}  // namespace spillway::kernels
