// make_device: picks the backend by name at run time.
// "auto" takes cuda when this build has it and a GPU answers, else the cpu backend.
#include <string>

#include "device/cpu_device.hpp"
#include "device/device.hpp"
#include "device/error.hpp"
#if SPILLWAY_HAVE_CUDA
#include "device/cuda_device.hpp"
#endif

namespace spillway {

const char* to_string(backend b) noexcept { return b == backend::cuda ? "cuda" : "cpu"; }

const char* to_string(copy_kind k) noexcept {
  switch (k) {
    case copy_kind::host_to_device: return "host_to_device";
    case copy_kind::device_to_host: return "device_to_host";
    case copy_kind::device_to_device: return "device_to_device";
    case copy_kind::host_to_host: return "host_to_host";
  }
  return "?";
}

bool cuda_available() noexcept {
#if SPILLWAY_HAVE_CUDA
  return probe_cuda().count > 0;
#else
  return false;
#endif
}

std::string cuda_problem() {
#if SPILLWAY_HAVE_CUDA
  return probe_cuda().problem;
#else
  return {};
#endif
}

std::unique_ptr<Device> make_device(std::string_view kind, const device_options& options) {
  if (kind == "cpu") return std::make_unique<cpu_device>(options);
  if (kind == "cuda" || kind == "auto") {
#if SPILLWAY_HAVE_CUDA
    const auto probe = probe_cuda();
    if (probe.count > 0) return make_cuda_device(options);
    if (!probe.problem.empty()) {
      throw config_error("backend \"" + std::string(kind) + "\": " + probe.problem +
                         "; fix the driver, or ask for backend \"cpu\" to run without the GPU");
    }
#endif
    if (kind == "auto") return std::make_unique<cpu_device>(options);
#if SPILLWAY_HAVE_CUDA
    throw config_error("backend \"cuda\" requested but no GPU answers; use \"cpu\" or \"auto\"");
#else
    throw config_error("backend \"cuda\" requested but this build has no CUDA backend (configure with -Dcuda=enabled); use \"cpu\" or \"auto\"");
#endif
  }
  throw config_error("unknown backend \"" + std::string(kind) + "\"; use \"auto\", \"cpu\" or \"cuda\"");
}

}  // namespace spillway
