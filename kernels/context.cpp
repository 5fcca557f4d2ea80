// kernel_context on a build without CUDA, and the parts common to both builds (the workspace).
// The cuda handles are made in context_cuda.cpp when the build has the toolkit.
#include "kernels/context.hpp"

#include <cstdint>
#include <string>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway::kernels {

#if !SPILLWAY_HAVE_CUDA
namespace detail {
struct cuda_handles {};
}  // namespace detail

kernel_context::kernel_context(Device& device) : device_(&device), backend_(device.properties().backend) {
  SPILLWAY_EXPECTS(backend_ == spillway::backend::cpu,
                   "this build of spillway has no CUDA kernels; use the cpu backend");
}

kernel_context::~kernel_context() = default;

void* kernel_context::cublas_handle() const {
  SPILLWAY_EXPECTS_T(usage_error, false, "cublas_handle: this build has no CUDA");
}
void* kernel_context::cudnn_handle() const {
  SPILLWAY_EXPECTS_T(usage_error, false, "cudnn_handle: this build has no CUDA");
}
detail::kernel_report kernel_context::take_report() {
  SPILLWAY_EXPECTS_T(usage_error, false, "take_report: this build has no CUDA");
}
#endif

void kernel_context::bind_workspace(void* memory, std::size_t bytes) {
  SPILLWAY_EXPECTS_T(usage_error, (memory == nullptr) == (bytes == 0),
                     "bind_workspace: memory and size must be given together");
  SPILLWAY_EXPECTS_T(usage_error, reinterpret_cast<std::uintptr_t>(memory) % 256 == 0,
                     "bind_workspace: the workspace must be 256-byte aligned (as Device::allocate returns it)");
  workspace_ = memory;
  workspace_bytes_ = bytes;
}

void* kernel_context::workspace(std::size_t bytes, const char* kernel) const {
  SPILLWAY_EXPECTS_T(usage_error, bytes <= workspace_bytes_,
                     std::string(kernel) + " needs a workspace of " + std::to_string(bytes) + " bytes (" +
                         format_bytes(bytes) + "), but " +
                         (workspace_bytes_ == 0 ? std::string("none is bound")
                                                : std::to_string(workspace_bytes_) + " bytes are bound") +
                         "; bind at least that much before training (kernel_context::bind_workspace, sized from "
                         "the kernel's *_workspace_bytes)");
  return workspace_;
}

}  // namespace spillway::kernels
