// kernel_context: what every kernel launch needs besides its stream — the Device, its backend,
// the workspace the caller binds, and on the cuda backend the cuBLAS and cuDNN handles.
//
// Launch contract, shared by every kernel in kernels/:
//  * A kernel is enqueued on the stream it is given and returns at once. Pointers name device
//    memory of ctx.device() (on the cpu backend that is host memory from Device::allocate, but
//    any host memory works there); they must stay valid until the stream reaches the kernel.
//  * cpu backend: the work runs on the stream's own worker via Device::launch_kernel, with oneTBB
//    for parallel loops inside. Errors found there are sticky and rethrown by the next
//    synchronize of the stream. cuda backend: the kernel is launched on (cudaStream_t)s.handle.
//  * Layouts are row-major: a matrix [rows, cols] has element (r, c) at r * cols + c. Images are
//    NCHW. Tensors are float32, or bf16 for the kernels' bf16 overloads (kernels/bf16.hpp:
//    stored in bf16, computed in float32); token ids and class targets are int32.
//  * Determinism: see Note [Deterministic kernels] below.
//  * A context is used from one host thread at a time (cuBLAS and cuDNN handles are not
//    thread-safe); make one context per thread that launches. Kernels launch on the thread's
//    current GPU: the context makes its device current when it is made and when a library
//    handle is taken, and every Device call does the same, so a launch inside a Session op
//    (whose scope has just called the Device) goes to the Session's GPU.
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
//    Device::allocate is 256-byte aligned, and the arena hands out multiples of 512 bytes from
//    such a base).
//
// Note [Workspace]
// Some kernels need device scratch: cuDNN convolutions (their algorithm's workspace),
// softmax_cross_entropy when the caller wants only the mean (the per-row losses, on both
// backends), the bf16 GEMM on the cpu backend (its operands widened to float32 for
// cblas_sgemm), and cuBLAS (its own workspace, used by some GEMM kernels). That scratch is
// device memory like any tensor, so it must sit inside the budget: the context never allocates
// it. The caller binds memory it owns and budgets (bind_workspace, or a workspace_scope for
// one op; the examples take it from the Session as a tensor of kind workspace, so the planner
// counts it), sized before training from the *_workspace_bytes functions of the kernels it
// launches. A kernel that needs more than is bound fails at its launch with an error that
// names the size to bind; nothing grows mid-step (no synchronize, free and allocate in the
// middle of a step, as a growable workspace would do). cuBLAS is given the bound workspace at
// every GEMM (cublasSetWorkspace), and none when nothing is bound: it then runs kernels that
// need no workspace, and never falls back on the default pool it would allocate for itself.
// Both backends follow the same rule (a kernel that needs scratch on the cpu backend takes it
// from the binding too), so a cpu test shows that a program binds and sizes its workspaces
// before training and never grows them mid-step; the sizes themselves are the backend's.
//
// Note [Reports from kernels]
// Some arguments can be checked only where the data is: a class target past the classes, a
// token id outside the vocabulary, lives in device memory. The cpu launcher checks it in its
// work on the stream and throws there, so the usage_error is the stream's sticky failure,
// rethrown by the next synchronize. The cuda launcher gives the same error at the same place:
// a small kernel (cuda_report_first_outside) writes what it found (two int32: the first bad
// index or -1, and its value) into a report slot in pinned host memory the GPU writes through
// its mapping, and a host function queued after it on the same stream (Device::launch_host,
// detail::launch_with_report) reads the slot and throws the cpu launcher's error; the cuda device
// keeps a host function's exception as its sticky failure, as the cpu device keeps a kernel's.
// The host function reads host memory only, so it never calls the Device. Slots come from a
// pool in the context, 512 to a page, each free again once its host function has read it; the
// pool grows by a page when every slot is in flight, and the context's destructor waits for
// the device before it gives the pages back. No device memory, so nothing outside the budget.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "device/device.hpp"

namespace spillway::kernels {

namespace detail {
struct cuda_handles;  // defined in context_cuda.cpp, only in builds with CUDA

/// A report slot (Note [Reports from kernels]): two int32 that kernels write through `device`
/// and a host function queued after them reads through `host`, then frees (busy = false).
struct kernel_report {
  std::int32_t* device = nullptr;
  const volatile std::int32_t* host = nullptr;
  std::atomic<bool>* busy = nullptr;
};
}  // namespace detail

/// The handles and report slots kernels launch with. It holds its Device by reference and, on
/// the cuda backend, gives pinned pages back to it when destroyed: destroy it before its Device.
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

  /// Binds `bytes` of device memory at `memory` (of this context's device, 256-byte aligned)
  /// as the workspace of the kernels launched from now until the next bind (Note [Workspace]).
  /// The caller keeps it valid until the stream reaches those kernels and binds memory that no
  /// other stream is using. bind_workspace(nullptr, 0) unbinds.
  void bind_workspace(void* memory, std::size_t bytes);
  [[nodiscard]] void* workspace_memory() const noexcept { return workspace_; }
  [[nodiscard]] std::size_t workspace_bytes() const noexcept { return workspace_bytes_; }

  /// For launchers: the bound workspace when it holds at least `bytes`; otherwise a
  /// spillway::error naming `kernel`, the size it needs and the size bound. Never allocates.
  [[nodiscard]] void* workspace(std::size_t bytes, const char* kernel) const;

  /// cuda backend, for launchers: a report slot that no work in flight uses (Note [Reports
  /// from kernels]); the host function that reads it frees it. A usage_error on the cpu backend.
  [[nodiscard]] detail::kernel_report take_report();

 private:
  Device* device_;
  spillway::backend backend_;
  std::unique_ptr<detail::cuda_handles> cuda_;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

/// Binds a workspace for the launches inside a scope (one op), and restores the previous
/// binding at its end.
class workspace_scope {
 public:
  workspace_scope(kernel_context& ctx, void* memory, std::size_t bytes)
      : ctx_(ctx), memory_(ctx.workspace_memory()), bytes_(ctx.workspace_bytes()) {
    ctx.bind_workspace(memory, bytes);
  }
  ~workspace_scope() {
    try {
      ctx_.bind_workspace(memory_, bytes_);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the old binding was valid when it was made
    }
  }
  workspace_scope(const workspace_scope&) = delete;
  workspace_scope& operator=(const workspace_scope&) = delete;

 private:
  kernel_context& ctx_;
  void* memory_;
  std::size_t bytes_;
};

}  // namespace spillway::kernels
