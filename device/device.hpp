// The Device contract: the one door to the hardware (memory, streams, events, copies).
// Everything above device/ is written once against this interface and runs on both backends.
//
// Contract, in brief (mirrors the CUDA runtime so the cuda backend is a thin shim):
//  * allocate(bytes) returns device memory aligned to 256 bytes, or throws out_of_memory
//    exactly as cudaMalloc fails when the device is full. deallocate(nullptr, n) is a no-op.
//  * allocate_pinned(bytes) returns page-aligned host memory that the device can copy from
//    asynchronously; it is anonymous memory, so io_uring may register it as a fixed buffer.
//  * A stream runs its work in order. Work on different streams may run concurrently.
//  * An event marks a position in a stream: record_event captures all work enqueued on the
//    stream so far; query_event/synchronize_event ask whether that work has finished; an event
//    never recorded counts as finished. stream_wait_event makes later work on a stream wait
//    for the event's position (the position at the time of the call).
//  * copy_async copies bytes in stream order. Host-to-device and device-to-host copies use the
//    copy engine of their direction, so they overlap with each other and with compute.
//  * launch_host enqueues a host function (cudaLaunchHostFunc): it runs when the stream reaches
//    it, on a callback thread that the host functions of every stream share, in an order CUDA
//    leaves undefined. So a host function must be short, must not call the Device (nor anything
//    that does), and must never wait for other work: a host function of another stream may be
//    queued behind it. Note [Host functions] in cpu_device.cpp says how the cpu backend holds
//    code to this.
//  * launch_kernel enqueues cpu work that stands for a kernel: on the cpu backend it runs on
//    the stream's own worker, like a GPU kernel on its stream; it must not call the Device.
//    The cuda backend runs it as a host function (only tests use it there).
//  * Memory given to copy_async from the host that is not pinned (allocate_pinned) makes the
//    copy synchronous for the caller. CUDA does so for copies to such memory; from it, CUDA
//    takes the bytes before returning but may not wait for the stream. The cpu backend waits
//    in both directions, the stricter of the two.
//  * deallocate synchronises the device first, as cudaFree does: keep it off the hot path.
//  * Failures inside stream work are sticky, as a CUDA context's errors are: once a kernel,
//    copy or host function fails, every later synchronize (and query, and enqueue) of any
//    stream of the device rethrows that first failure, for the device's whole life.
//  * Timing events (create_timing_event) measure device time between two recorded positions
//    (elapsed_ms) without any host function in the stream.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "device/interface.hpp"

namespace spillway {

enum class backend { cpu, cuda };

const char* to_string(backend b) noexcept;

enum class copy_kind { host_to_device, device_to_host, device_to_device, host_to_host };

const char* to_string(copy_kind k) noexcept;

/// Priority of a stream: copies that feed the next kernel (prefetch) run ahead of the rest.
enum class stream_priority { low, normal, high };

/// Whether a stream is ordered with the device's default stream: on CUDA, the legacy stream 0
/// that takes work launched with no stream (a kernel launched without one, a synchronous
/// cudaMemcpy or cudaMemset, a cuBLAS handle never given a stream). `ordered` (cudaStreamDefault)
/// makes such work wait for the stream's earlier work, and the stream's later work wait for it;
/// `independent` (cudaStreamNonBlocking) leaves the two unordered. Neither orders the per-thread
/// default stream (nvcc --default-stream per-thread) or other streams. The cpu backend has no
/// default stream, nothing runs outside its streams, so the two are the same there.
enum class default_stream_order { independent, ordered };

/// A stream handle. Cheap to copy; the Device that created it owns what it refers to.
struct stream {
  void* handle = nullptr;
  friend bool operator==(stream, stream) = default;
};

/// An event handle. Cheap to copy; the Device that created it owns what it refers to.
struct event {
  void* handle = nullptr;
  friend bool operator==(event, event) = default;
};

struct device_properties {
  std::string name;
  spillway::backend backend = backend::cpu;
  std::size_t total_memory = 0;  ///< bytes of device memory the device has
  int copy_engines = 0;          ///< independent copy engines (2: one per direction)
  int numa_node = -1;            ///< host NUMA node nearest the device; -1 means any
};

/// Options for make_device. Fields a backend does not use are ignored by it.
struct device_options {
  /// cpu backend: capacity of the emulated device memory; 0 = 1 GiB. (session_config's
  /// cpu_device_memory; nothing below the Session reads the environment.)
  std::size_t cpu_device_memory = 0;
  /// cpu backend: link bandwidth per direction in bytes/s (0 = unlimited). A copy of n bytes
  /// then takes at least n / bandwidth seconds on its copy engine.
  double h2d_bytes_per_second = 0;
  double d2h_bytes_per_second = 0;
  /// cuda backend: which GPU.
  int cuda_device = 0;
  /// Both backends: ask for transparent huge pages for pinned memory before it is pinned, so a
  /// DMA is a few segments instead of one per 4 KiB page (Note [Huge pages for registered
  /// buffers] in device/huge_pages.cpp). Off gives 4 KiB pages, for comparison.
  bool pinned_huge_pages = true;
  /// cpu backend, a debug mode: device memory is readable only while stream work of the device
  /// runs, so host code that touches it from a host thread (not from a kernel, copy, memset or
  /// host function) faults at once, with a line on stderr naming the address, instead of racing
  /// with the stream. Catches most such accesses, not all (Note [Debug host access] in
  /// cpu_device.cpp). (session_config's cpu_debug_host_access.)
  bool debug_host_access = false;

  /// cpu backend: the rules that make it at least as strict as CUDA (Note [Host functions] in
  /// cpu_device.cpp). All on by default and in every test; a test build switches one off only
  /// to show that its conformance test catches a backend without it.
  struct strict_rules {
    /// Host functions of every stream share one callback thread, in an order chosen by a seed.
    bool one_callback_thread = true;
    /// A host function, or a cpu kernel, that calls the Device fails (sticky error).
    bool no_device_calls_in_stream_work = true;
    /// A host function that holds the callback thread this long while a host function of
    /// another stream waits behind it is an error naming both (0: wait forever, as CUDA does).
    std::chrono::milliseconds host_function_limit{5000};
    /// Copies to or from host memory that is not pinned return only when the copy is done.
    bool pageable_copies_synchronous = true;
    /// A copy whose pointers do not match its kind (host memory where the kind says device
    /// memory, or device memory where it says host), or a memset of memory that is neither
    /// device memory nor pinned, fails at the call: cudaMemcpy leaves such a copy undefined.
    bool copy_kinds_checked = true;
    /// deallocate() waits for all work on every stream first, as cudaFree does.
    bool free_synchronizes = true;
    /// The first failure of stream work is rethrown by every later call, for the device's life.
    bool sticky_errors = true;
    /// Picks the order of host functions that are ready at once; 0 = 1. (session_config's
    /// cpu_callback_seed.)
    std::uint64_t callback_seed = 0;
  };
  strict_rules strict;
};

class Device : public abstract_interface {
 public:
  [[nodiscard]] virtual const device_properties& properties() const noexcept = 0;

  // Device memory.
  [[nodiscard]] virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
  /// Bytes of device memory currently handed out by this Device's allocate() and not yet given
  /// back, on either backend (on cuda, the runtime's own use and other processes' are not in it).
  [[nodiscard]] virtual std::size_t used_memory() const = 0;
  /// Bytes of device memory that allocate() can still hand out now (cpu backend: capacity less
  /// used; cuda: the free memory the runtime reports, which other processes also take from).
  [[nodiscard]] virtual std::size_t free_memory() const = 0;

  // Pinned host memory.
  [[nodiscard]] virtual void* allocate_pinned(std::size_t bytes) = 0;
  virtual void deallocate_pinned(void* ptr, std::size_t bytes) noexcept = 0;

  // Streams.
  [[nodiscard]] virtual stream create_stream(stream_priority priority = stream_priority::normal,
                                             default_stream_order order = default_stream_order::independent) = 0;
  virtual void destroy_stream(stream s) noexcept = 0;
  virtual void synchronize_stream(stream s) = 0;

  // Events.
  [[nodiscard]] virtual event create_event() = 0;
  virtual void destroy_event(event e) noexcept = 0;
  virtual void record_event(event e, stream s) = 0;
  [[nodiscard]] virtual bool query_event(event e) = 0;
  virtual void synchronize_event(event e) = 0;
  virtual void stream_wait_event(stream s, event e) = 0;
  /// An event that also records when the device reached it, for elapsed_ms.
  [[nodiscard]] virtual event create_timing_event() = 0;
  /// Milliseconds of device time from `start` to `end`, both timing events that have been
  /// recorded and reached (synchronize first); throws spillway::error otherwise.
  [[nodiscard]] virtual double elapsed_ms(event start, event end) = 0;

  // Work.
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream s) = 0;
  virtual void memset_async(void* dst, int value, std::size_t bytes, stream s) = 0;
  virtual void launch_host(stream s, std::function<void()> work) = 0;
  virtual void launch_kernel(stream s, std::function<void()> work) = 0;

  /// Waits for all work on every stream of this device.
  virtual void synchronize() = 0;

  /// Makes this device current on the calling thread (cuda: cudaSetDevice; a no-op on the cpu
  /// backend). Every Device call does it for itself; code that launches kernels or makes
  /// library handles (cuBLAS, cuDNN) itself calls it first, since those follow the thread's
  /// current GPU, which is GPU 0 on a new thread.
  virtual void make_current() = 0;
};

/// Creates a device. `kind` is "auto" (cuda when built with it and a GPU answers, else cpu),
/// "cpu" or "cuda". Anything else, or "cuda" where there is none, is a config_error.
std::unique_ptr<Device> make_device(std::string_view kind, const device_options& options = {});

/// True when this build has the cuda backend and at least one GPU answers.
bool cuda_available() noexcept;

/// Why no GPU answers where one should: empty when the build has no cuda backend, when no
/// driver is installed, or when GPUs answer; else the runtime's error (a driver older than the
/// runtime, a device that failed to initialise), which make_device("auto") also throws.
std::string cuda_problem();

/// RAII owner of a handle that a Device made and `Destroy` gives back (a stream, an event).
/// Movable, not assignable.
template <class Handle, void (Device::*Destroy)(Handle) noexcept>
class device_owned {
 public:
  device_owned(Device& d, Handle h) : dev_(&d), h_(h) {}
  ~device_owned() { if (dev_ != nullptr) (dev_->*Destroy)(h_); }
  device_owned(device_owned&& o) noexcept : dev_(o.dev_), h_(o.h_) { o.dev_ = nullptr; }
  device_owned& operator=(device_owned&&) = delete;
  [[nodiscard]] Handle get() const noexcept { return h_; }
  operator Handle() const noexcept { return h_; }  // NOLINT: implicit by design

 private:
  Device* dev_;
  Handle h_;
};

/// RAII owner of a stream.
class owned_stream : public device_owned<stream, &Device::destroy_stream> {
 public:
  owned_stream(Device& d, stream_priority p = stream_priority::normal,
               default_stream_order o = default_stream_order::independent)
      : device_owned(d, d.create_stream(p, o)) {}
};

/// RAII owner of an event.
class owned_event : public device_owned<event, &Device::destroy_event> {
 public:
  explicit owned_event(Device& d) : device_owned(d, d.create_event()) {}
  /// A timing event (Device::create_timing_event).
  owned_event(Device& d, bool timing) : device_owned(d, timing ? d.create_timing_event() : d.create_event()) {}
};

}  // namespace spillway
