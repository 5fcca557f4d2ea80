// kernel_context on a build without CUDA, and the parts common to both builds.
// The cuda handles are made in context_cuda.cpp when the build has the toolkit.
#include "kernels/context.hpp"

#include "device/error.hpp"

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
  SPILLWAY_EXPECTS(false, "cublas_handle: this build has no CUDA");
}
void* kernel_context::cudnn_handle() const {
  SPILLWAY_EXPECTS(false, "cudnn_handle: this build has no CUDA");
}
void* kernel_context::workspace(std::size_t, stream) {
  SPILLWAY_EXPECTS(false, "workspace: this build has no CUDA");
}
#endif

}  // namespace spillway::kernels
