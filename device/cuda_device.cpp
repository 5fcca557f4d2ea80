// The cuda backend's implementation over the CUDA runtime API.
// Pinned memory is anonymous memory bound to the GPU's NUMA node, then cudaHostRegister'ed.
#include "device/cuda_device.hpp"

#include <cuda_runtime_api.h>
#include <numa.h>
#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <fstream>
#include <mutex>
#include <unordered_map>

#include "device/cuda_check.hpp"
#include "device/units.hpp"

namespace spillway {
namespace {

constexpr std::size_t page = 4096;
std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

cudaStream_t native(stream s) { return static_cast<cudaStream_t>(s.handle); }
cudaEvent_t native(event e) { return static_cast<cudaEvent_t>(e.handle); }

cudaMemcpyKind native(copy_kind k) {
  switch (k) {
    case copy_kind::host_to_device: return cudaMemcpyHostToDevice;
    case copy_kind::device_to_host: return cudaMemcpyDeviceToHost;
    case copy_kind::device_to_device: return cudaMemcpyDeviceToDevice;
    case copy_kind::host_to_host: return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

class cuda_device final : public Device {
 public:
  explicit cuda_device(const device_options& o) : ordinal_(o.cuda_device) {
    int count = 0;
    SPILLWAY_CUDA_TRY(cudaGetDeviceCount(&count));
    SPILLWAY_EXPECTS_T(config_error, ordinal_ >= 0 && ordinal_ < count,
                       "cuda device " + std::to_string(ordinal_) + " requested but " +
                           std::to_string(count) + " GPU(s) answer");
    SPILLWAY_CUDA_TRY(cudaSetDevice(ordinal_));
    cudaDeviceProp p{};
    SPILLWAY_CUDA_TRY(cudaGetDeviceProperties(&p, ordinal_));
    props_.name = p.name;
    props_.backend = backend::cuda;
    props_.total_memory = p.totalGlobalMem;
    props_.copy_engines = p.asyncEngineCount;
    char bus[32] = {};
    SPILLWAY_CUDA_TRY(cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal_));
    props_.numa_node = numa_node_of_pci_bus(bus);
    SPILLWAY_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least_priority_, &greatest_priority_));
  }

  const device_properties& properties() const noexcept override { return props_; }

  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    activate();
    void* p = nullptr;
    SPILLWAY_CUDA_TRY(cudaMalloc(&p, bytes));
    std::lock_guard lock(m_);
    used_ += bytes;
    sizes_[p] = bytes;
    return p;
  }
  void deallocate(void* ptr, std::size_t) noexcept override {
    if (ptr == nullptr) return;
    (void)cudaSetDevice(ordinal_);
    (void)cudaFree(ptr);
    std::lock_guard lock(m_);
    auto it = sizes_.find(ptr);
    if (it != sizes_.end()) {
      used_ -= it->second;
      sizes_.erase(it);
    }
  }
  std::size_t free_memory() const override {
    SPILLWAY_CUDA_TRY(cudaSetDevice(ordinal_));
    std::size_t free = 0, total = 0;
    SPILLWAY_CUDA_TRY(cudaMemGetInfo(&free, &total));
    return free;
  }
  std::size_t used_memory() const override {
    std::lock_guard lock(m_);
    return used_;
  }

  void* allocate_pinned(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    const std::size_t n = round_up(bytes, page);
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw out_of_memory("cannot map " + format_bytes(bytes) + " of host memory to pin");
    if (props_.numa_node >= 0 && numa_available() >= 0) numa_tonode_memory(p, n, props_.numa_node);
    activate();
    const cudaError_t status = cudaHostRegister(p, n, cudaHostRegisterDefault);
    if (status != cudaSuccess) {
      ::munmap(p, n);
      detail::throw_cuda(status, "cudaHostRegister", __FILE__, __LINE__);
    }
    return p;
  }
  void deallocate_pinned(void* ptr, std::size_t bytes) noexcept override {
    if (ptr == nullptr) return;
    (void)cudaHostUnregister(ptr);
    ::munmap(ptr, round_up(bytes, page));
  }

  stream create_stream(stream_priority priority) override {
    activate();
    int value = 0;  // CUDA: lower numbers are higher priority; 0 is the default
    if (priority == stream_priority::high) value = greatest_priority_;
    if (priority == stream_priority::low) value = least_priority_;
    cudaStream_t s = nullptr;
    SPILLWAY_CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, value));
    return stream{s};
  }
  void destroy_stream(stream s) noexcept override { (void)cudaStreamDestroy(native(s)); }
  void synchronize_stream(stream s) override {
    SPILLWAY_CUDA_TRY(cudaStreamSynchronize(native(s)));
    rethrow_host_failure();
  }

  event create_event() override {
    activate();
    cudaEvent_t e = nullptr;
    SPILLWAY_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return event{e};
  }
  void destroy_event(event e) noexcept override { (void)cudaEventDestroy(native(e)); }
  void record_event(event e, stream s) override { SPILLWAY_CUDA_TRY(cudaEventRecord(native(e), native(s))); }
  bool query_event(event e) override {
    const cudaError_t status = cudaEventQuery(native(e));
    if (status == cudaErrorNotReady) return false;
    SPILLWAY_CUDA_TRY(status);
    return true;
  }
  void synchronize_event(event e) override { SPILLWAY_CUDA_TRY(cudaEventSynchronize(native(e))); }
  void stream_wait_event(stream s, event e) override {
    SPILLWAY_CUDA_TRY(cudaStreamWaitEvent(native(s), native(e), 0));
  }

  void copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream s) override {
    if (bytes == 0) return;
    SPILLWAY_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, native(kind), native(s)));
  }
  void memset_async(void* dst, int value, std::size_t bytes, stream s) override {
    if (bytes == 0) return;
    SPILLWAY_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, native(s)));
  }
  void launch_host(stream s, std::function<void()> work) override {
    struct payload {
      cuda_device* self;
      std::function<void()> fn;
    };
    auto* p = new payload{this, std::move(work)};
    const cudaError_t status = cudaLaunchHostFunc(
        native(s),
        [](void* raw) {
          std::unique_ptr<payload> job(static_cast<payload*>(raw));
          try {
            job->fn();
          } catch (...) {
            std::lock_guard lock(job->self->m_);
            if (!job->self->host_failure_) job->self->host_failure_ = std::current_exception();
          }
        },
        p);
    if (status != cudaSuccess) {
      delete p;
      detail::throw_cuda(status, "cudaLaunchHostFunc", __FILE__, __LINE__);
    }
  }
  void synchronize() override {
    activate();
    SPILLWAY_CUDA_TRY(cudaDeviceSynchronize());
    rethrow_host_failure();
  }

 private:
  void activate() { SPILLWAY_CUDA_TRY(cudaSetDevice(ordinal_)); }
  void rethrow_host_failure() {
    std::exception_ptr f;
    {
      std::lock_guard lock(m_);
      std::swap(f, host_failure_);
    }
    if (f) std::rethrow_exception(f);
  }

  int ordinal_;
  device_properties props_;
  int least_priority_ = 0;
  int greatest_priority_ = 0;
  mutable std::mutex m_;
  std::size_t used_ = 0;
  std::unordered_map<void*, std::size_t> sizes_;
  std::exception_ptr host_failure_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(const device_options& options) {
  return std::make_unique<cuda_device>(options);
}

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

}  // namespace spillway
