// The cuda backend's implementation over the CUDA runtime API.
// Pinned memory is anonymous memory bound to the GPU's NUMA node, then cudaHostRegister'ed.
#include "device/cuda_device.hpp"

#include <cuda_runtime_api.h>
#include <numa.h>
#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <unordered_map>

#include "device/cuda_check.hpp"
#include "device/huge_pages.hpp"
#include "device/stream_work.hpp"
#include "device/units.hpp"

namespace spillway {
namespace {

constexpr std::size_t page = 4096;

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
  explicit cuda_device(const device_options& o) : ordinal_(o.cuda_device), pinned_huge_pages_(o.pinned_huge_pages) {
    int count = 0;
    SPILLWAY_CUDA_TRY(cudaGetDeviceCount(&count));
    if (ordinal_ < 0 || ordinal_ >= count)
      throw config_error("cuda device " + std::to_string(ordinal_) + " (device_options.cuda_device) requested but " +
                         std::to_string(count) + " GPU(s) answer; use 0 to " + std::to_string(count - 1));
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

  // Work still queued (a host function among it) would otherwise run against a destroyed
  // Device; the cpu backend drains its streams the same way.
  ~cuda_device() override {
    if (cudaSetDevice(ordinal_) == cudaSuccess) (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
  }
  cuda_device(const cuda_device&) = delete;
  cuda_device& operator=(const cuda_device&) = delete;

  const device_properties& properties() const noexcept override { return props_; }

  void* allocate(std::size_t bytes) override {
    check_caller("allocate");
    if (bytes == 0) return nullptr;
    activate();
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess) detail::throw_cuda(status, "cudaMalloc", __FILE__, __LINE__);  // clears it
    std::lock_guard lock(m_);
    used_ += bytes;
    sizes_[p] = bytes;
    return p;
  }
  void deallocate(void* ptr, std::size_t) noexcept override {
    if (ptr == nullptr) return;
    if (!caller_may_call("deallocate")) return;
    {
      // Off the books before the memory goes back: once cudaFree returns, another thread's
      // cudaMalloc may be handed this very address.
      std::lock_guard lock(m_);
      auto it = sizes_.find(ptr);
      if (it != sizes_.end()) {
        used_ -= it->second;
        sizes_.erase(it);
      }
    }
    note_failure(cudaSetDevice(ordinal_), "cudaSetDevice");
    note_failure(cudaFree(ptr), "cudaFree");
  }
  std::size_t free_memory() const override {
    check_caller("free_memory");
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
    check_caller("allocate_pinned");
    if (bytes == 0) return nullptr;
    const std::size_t n = round_up(bytes, page);
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw out_of_memory("cuda device: cannot map " + format_bytes(bytes) + " of host memory to pin: " + std::strerror(errno));
    if (props_.numa_node >= 0 && numa_available() >= 0) numa_tonode_memory(p, n, props_.numa_node);
    // Before cudaHostRegister, which pins the pages (pinned pages cannot be collapsed later):
    // the pages it faults in then come as huge pages (Note [Huge pages for registered buffers]).
    if (pinned_huge_pages_) (void)detail::back_with_huge_pages(p, n);
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
    if (!caller_may_call("deallocate_pinned")) return;
    note_failure(cudaSetDevice(ordinal_), "cudaSetDevice");
    note_failure(cudaHostUnregister(ptr), "cudaHostUnregister");
    ::munmap(ptr, round_up(bytes, page));
  }

  stream create_stream(stream_priority priority, default_stream_order order) override {
    check_caller("create_stream");
    activate();
    int value = 0;  // CUDA: lower numbers are higher priority; 0 is the default
    if (priority == stream_priority::high) value = greatest_priority_;
    if (priority == stream_priority::low) value = least_priority_;
    cudaStream_t s = nullptr;
    const unsigned flags = order == default_stream_order::ordered ? cudaStreamDefault : cudaStreamNonBlocking;
    SPILLWAY_CUDA_TRY(cudaStreamCreateWithPriority(&s, flags, value));
    return stream{s};
  }
  void destroy_stream(stream s) noexcept override {
    if (!caller_may_call("destroy_stream")) return;
    note_failure(cudaSetDevice(ordinal_), "cudaSetDevice");
    note_failure(cudaStreamDestroy(native(s)), "cudaStreamDestroy");
  }
  void synchronize_stream(stream s) override {
    check_caller("synchronize_stream");
    activate();
    SPILLWAY_CUDA_TRY(cudaStreamSynchronize(native(s)));
    rethrow_host_failure();
  }

  event create_event() override { return make_event("create_event", cudaEventDisableTiming); }
  event create_timing_event() override { return make_event("create_timing_event", cudaEventDefault); }
  double elapsed_ms(event start, event end) override {
    check_caller("elapsed_ms");
    activate();
    float ms = 0;
    SPILLWAY_CUDA_TRY(cudaEventElapsedTime(&ms, native(start), native(end)));
    return ms;
  }
  void destroy_event(event e) noexcept override {
    if (!caller_may_call("destroy_event")) return;
    note_failure(cudaSetDevice(ordinal_), "cudaSetDevice");
    note_failure(cudaEventDestroy(native(e)), "cudaEventDestroy");
  }
  void record_event(event e, stream s) override {
    check_caller("record_event");
    activate();
    SPILLWAY_CUDA_TRY(cudaEventRecord(native(e), native(s)));
  }
  bool query_event(event e) override {
    check_caller("query_event");
    rethrow_host_failure();
    activate();
    const cudaError_t status = cudaEventQuery(native(e));
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is an answer, not an error: leave no trace of it
      return false;
    }
    SPILLWAY_CUDA_TRY(status);
    return true;
  }
  void synchronize_event(event e) override {
    check_caller("synchronize_event");
    activate();
    SPILLWAY_CUDA_TRY(cudaEventSynchronize(native(e)));
    rethrow_host_failure();
  }
  void stream_wait_event(stream s, event e) override {
    check_caller("stream_wait_event");
    activate();
    SPILLWAY_CUDA_TRY(cudaStreamWaitEvent(native(s), native(e), 0));
  }

  void copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream s) override {
    check_caller("copy_async");
    if (bytes == 0) return;
    rethrow_host_failure();
    activate();
    SPILLWAY_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, native(kind), native(s)));
  }
  void memset_async(void* dst, int value, std::size_t bytes, stream s) override {
    check_caller("memset_async");
    if (bytes == 0) return;
    rethrow_host_failure();
    activate();
    SPILLWAY_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, native(s)));
  }
  void launch_kernel(stream s, std::function<void()> work) override {
    // cpu work standing for a kernel: on a GPU only tests enqueue it, as a host function.
    launch_host(s, std::move(work));
  }
  void launch_host(stream s, std::function<void()> work) override {
    check_caller("launch_host");
    rethrow_host_failure();
    activate();
    struct payload {
      cuda_device* self;
      std::function<void()> fn;
    };
    auto* p = new payload{this, std::move(work)};
    const cudaError_t status = cudaLaunchHostFunc(
        native(s),
        [](void* raw) {
          // The scope first: the work's captures are destroyed inside it (after job), so a
          // capture whose destructor calls the Device is caught as the work itself would be.
          detail::stream_work_scope scope("a host function");
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
  void make_current() override {
    check_caller("make_current");
    activate();
  }
  void synchronize() override {
    check_caller("synchronize");
    activate();
    SPILLWAY_CUDA_TRY(cudaDeviceSynchronize());
    rethrow_host_failure();
  }

 private:
  // Makes this device current on the calling thread. Threads other than the one that made the
  // device (I/O completions, the Session's helpers, the event worker) launch, wait and free too,
  // and a thread starts on GPU 0: a runtime call there would make GPU 0's context for it.
  void activate() const {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == ordinal_) return;  // no driver call
    SPILLWAY_CUDA_TRY(cudaSetDevice(ordinal_));
  }
  event make_event(const char* call, unsigned flags) {
    check_caller(call);
    activate();
    cudaEvent_t e = nullptr;
    SPILLWAY_CUDA_TRY(cudaEventCreateWithFlags(&e, flags));
    return event{e};
  }
  // A host function may not call the runtime (CUDA answers cudaErrorNotPermitted, or hangs).
  static void check_caller(const char* call) {
    const char* what = detail::stream_work_context();
    SPILLWAY_EXPECTS_T(usage_error, what == nullptr,
                       std::string("cuda device: ") + call + " called from " + what +
                           "; stream work must not call the Device: do it on a host thread before or after it");
  }
  bool caller_may_call(const char* call) noexcept {
    try {
      check_caller(call);
      return true;
    } catch (...) {
      record_failure(std::current_exception());
      return false;
    }
  }
  // A failure where nothing can throw (a free, a destroy): kept, and reported by the next
  // synchronize, as the runtime reports an asynchronous error.
  void note_failure(cudaError_t status, const char* call) noexcept {
    if (status == cudaSuccess) return;
    try {
      detail::throw_cuda(status, call, __FILE__, __LINE__);
    } catch (...) {
      record_failure(std::current_exception());
    }
  }
  void record_failure(std::exception_ptr e) noexcept {
    std::lock_guard lock(m_);
    if (!host_failure_) host_failure_ = std::move(e);
  }
  // Sticky, as the context's own errors are: a failed host function fails every later call.
  void rethrow_host_failure() const {
    std::exception_ptr f;
    {
      std::lock_guard lock(m_);
      f = host_failure_;
    }
    if (f) std::rethrow_exception(f);
  }

  int ordinal_;
  bool pinned_huge_pages_;
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

cuda_probe probe_cuda() noexcept {
  cuda_probe r;
  const cudaError_t status = cudaGetDeviceCount(&r.count);
  if (status == cudaSuccess) return r;
  (void)cudaGetLastError();
  r.count = 0;
  // No driver installed, or none of its GPUs: simply no GPU. Any other answer (a driver older
  // than the runtime, a GPU that failed to initialise) is a problem the user must hear of.
  const bool driver_installed = [] {
    void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) h = ::dlopen("libcuda.so.1", RTLD_LAZY);
    if (h == nullptr) return false;
    ::dlclose(h);
    return true;
  }();
  if (status == cudaErrorNoDevice || !driver_installed) return r;
  r.problem = std::string("the CUDA runtime cannot use the GPUs: ") + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ")";
  return r;
}

}  // namespace spillway
