// The cpu backend's implementation.
// See Note [Copy engines] for how copies overlap and Note [Events] for event generations.
#include "device/cpu_device.hpp"

#include <sys/mman.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway {

// Note [Events]
// An event keeps two counters. record_event bumps `recorded` and enqueues work that raises
// `completed` to that generation when the stream reaches it. The event is finished when
// completed >= recorded. stream_wait_event captures the generation at the time of the call, so
// a later re-record does not change what an earlier wait waits for (as in CUDA).
struct cpu_device::event_impl {
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t recorded = 0;
  std::uint64_t completed = 0;
};

struct cpu_device::stream_impl {
  std::mutex m;
  std::condition_variable work;     // signals new work (or stopping) to the stream's thread
  std::condition_variable drained;  // signals pending reaching 0 to synchronize_stream
  std::deque<std::function<void()>> queue;
  std::size_t pending = 0;          // enqueued and not yet finished
  bool stopping = false;
  std::exception_ptr error;         // first failure of stream work; rethrown on synchronize
  std::chrono::nanoseconds delay{0};
  stream_priority priority = stream_priority::normal;
  std::thread worker;
};

namespace {
constexpr std::size_t device_alignment = 256;
constexpr std::size_t page = 4096;

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

std::size_t default_capacity(const device_options& o) {
  if (o.cpu_device_memory != 0) return o.cpu_device_memory;
  if (const char* env = std::getenv("SPILLWAY_CPU_DEVICE_MEMORY"); env != nullptr && *env != '\0')
    return parse_size(env, "SPILLWAY_CPU_DEVICE_MEMORY");
  return std::size_t{1} << 30;
}

// Sleeps until just before `deadline`, then spins the last few tens of microseconds. Stream
// threads run with a 1 us timer slack (see serve); spinning longer would steal the core that
// another stream's work needs on a small machine.
void wait_until(std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  std::this_thread::sleep_until(deadline - microseconds(60));  // a sleep overshoots by ~60 us
  while (steady_clock::now() < deadline) {
  }
}
}  // namespace

cpu_device::cpu_device(const device_options& options) : capacity_(default_capacity(options)) {
  props_.name = "cpu (emulated device, " + format_bytes(capacity_) + ")";
  props_.backend = backend::cpu;
  props_.total_memory = capacity_;
  props_.copy_engines = 2;
  props_.numa_node = -1;
  set_link_bandwidth(options.h2d_bytes_per_second, options.d2h_bytes_per_second);
}

cpu_device::~cpu_device() {
  std::list<stream_impl> streams;
  {
    std::lock_guard lock(streams_mutex_);
    streams.swap(streams_);
  }
  for (auto& q : streams) {
    {
      std::lock_guard lock(q.m);
      q.stopping = true;
    }
    q.work.notify_all();
    q.worker.join();
  }
  for (auto& [p, n] : device_blocks_) std::free(p);
  for (auto& [p, n] : pinned_blocks_) ::munmap(p, round_up(n, page));
}

// ---- memory -------------------------------------------------------------------------------

void* cpu_device::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t rounded = round_up(bytes, device_alignment);
  std::lock_guard lock(memory_mutex_);
  if (rounded > capacity_ - used_) {
    throw out_of_memory("cpu device: out of memory allocating " + format_bytes(bytes) + " (" +
                        format_bytes(used_) + " of " + format_bytes(capacity_) + " in use)");
  }
  void* p = std::aligned_alloc(device_alignment, rounded);
  if (p == nullptr) throw out_of_memory("cpu device: host allocation of " + format_bytes(rounded) + " failed");
  used_ += rounded;
  device_blocks_.emplace(p, rounded);
  return p;
}

void cpu_device::deallocate(void* ptr, std::size_t /*bytes*/) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(memory_mutex_);
  auto it = device_blocks_.find(ptr);
  if (it == device_blocks_.end()) std::abort();  // freeing memory this device did not hand out
  used_ -= it->second;
  device_blocks_.erase(it);
  std::free(ptr);
}

std::size_t cpu_device::used_memory() const {
  std::lock_guard lock(memory_mutex_);
  return used_;
}

std::size_t cpu_device::free_memory() const {
  std::lock_guard lock(memory_mutex_);
  return capacity_ - used_;
}

void* cpu_device::allocate_pinned(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = ::mmap(nullptr, round_up(bytes, page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw out_of_memory("cpu device: cannot map " + format_bytes(bytes) + " of pinned host memory");
  std::lock_guard lock(memory_mutex_);
  pinned_blocks_.emplace(p, bytes);
  return p;
}

void cpu_device::deallocate_pinned(void* ptr, std::size_t /*bytes*/) noexcept {
  if (ptr == nullptr) return;
  std::size_t n = 0;
  {
    std::lock_guard lock(memory_mutex_);
    auto it = pinned_blocks_.find(ptr);
    if (it == pinned_blocks_.end()) std::abort();
    n = it->second;
    pinned_blocks_.erase(it);
  }
  ::munmap(ptr, round_up(n, page));
}

// ---- streams ------------------------------------------------------------------------------

void cpu_device::serve(stream_impl& q) {
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: timed copies and delays wake on time
  for (;;) {
    std::function<void()> work;
    std::chrono::nanoseconds delay{};
    {
      std::unique_lock lock(q.m);
      q.work.wait(lock, [&] { return q.stopping || !q.queue.empty(); });
      if (q.queue.empty()) return;  // stopping and drained
      work = std::move(q.queue.front());
      q.queue.pop_front();
      delay = q.delay;
    }
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr failure;
    try {
      work();
    } catch (...) {
      failure = std::current_exception();
    }
    if (delay.count() > 0) wait_until(start + delay);
    bool drained = false;
    {
      std::lock_guard lock(q.m);
      if (failure && !q.error) q.error = failure;
      drained = --q.pending == 0;
    }
    // Only a drained queue is news to synchronize_stream: waking it after every item would cost
    // a context switch per item while the host waits for a long queue.
    if (drained) q.drained.notify_all();
  }
}

stream cpu_device::create_stream(stream_priority priority) {
  std::lock_guard lock(streams_mutex_);
  auto& q = streams_.emplace_back();
  q.priority = priority;
  q.worker = std::thread([&q] { serve(q); });
  return stream{&q};
}

cpu_device::stream_impl& cpu_device::impl(stream s) const {
  SPILLWAY_EXPECTS(s.handle != nullptr, "cpu device: null stream handle");
  return *static_cast<stream_impl*>(s.handle);
}

void cpu_device::destroy_stream(stream s) noexcept {
  if (s.handle == nullptr) return;
  auto* target = static_cast<stream_impl*>(s.handle);
  {
    std::lock_guard lock(target->m);
    target->stopping = true;
  }
  target->work.notify_all();
  target->worker.join();  // drains queued work first, as cudaStreamDestroy lets it finish
  std::lock_guard lock(streams_mutex_);
  streams_.remove_if([&](const stream_impl& q) { return &q == target; });
}

void cpu_device::enqueue(stream s, std::function<void()> work) {
  auto& q = impl(s);
  {
    std::lock_guard lock(q.m);
    SPILLWAY_EXPECTS(!q.stopping, "cpu device: work enqueued on a stream being destroyed");
    q.queue.push_back(std::move(work));
    ++q.pending;
  }
  q.work.notify_one();  // only the stream's own thread waits for work
}

void cpu_device::synchronize_stream(stream s) {
  auto& q = impl(s);
  std::exception_ptr failure;
  {
    std::unique_lock lock(q.m);
    q.drained.wait(lock, [&] { return q.pending == 0; });
    std::swap(failure, q.error);
  }
  if (failure) std::rethrow_exception(failure);
}

void cpu_device::synchronize() {
  std::vector<stream> all;
  {
    std::lock_guard lock(streams_mutex_);
    for (auto& q : streams_) all.push_back(stream{&q});
  }
  std::exception_ptr first;
  for (auto s : all) {
    try {
      synchronize_stream(s);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void cpu_device::set_stream_delay(stream s, std::chrono::nanoseconds extra) {
  auto& q = impl(s);
  std::lock_guard lock(q.m);
  q.delay = extra;
}

// ---- events -------------------------------------------------------------------------------

// The handle points at a shared_ptr so that work already enqueued keeps the event alive when
// it is destroyed early, as cudaEventDestroy allows.
using event_ref = std::shared_ptr<cpu_device::event_impl>;

event cpu_device::create_event() { return event{new event_ref(std::make_shared<event_impl>())}; }

void cpu_device::destroy_event(event e) noexcept { delete static_cast<event_ref*>(e.handle); }

std::shared_ptr<cpu_device::event_impl> cpu_device::impl(event e) {
  SPILLWAY_EXPECTS(e.handle != nullptr, "cpu device: null event handle");
  return *static_cast<event_ref*>(e.handle);
}

void cpu_device::record_event(event e, stream s) {
  auto ev = impl(e);
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(ev->m);
    generation = ++ev->recorded;
  }
  enqueue(s, [ev, generation] {
    {
      std::lock_guard lock(ev->m);
      ev->completed = std::max(ev->completed, generation);
    }
    ev->cv.notify_all();
  });
}

bool cpu_device::query_event(event e) {
  auto ev = impl(e);
  std::lock_guard lock(ev->m);
  return ev->completed >= ev->recorded;
}

void cpu_device::synchronize_event(event e) {
  auto ev = impl(e);
  std::unique_lock lock(ev->m);
  const auto target = ev->recorded;
  ev->cv.wait(lock, [&] { return ev->completed >= target; });
}

void cpu_device::stream_wait_event(stream s, event e) {
  auto ev = impl(e);
  std::uint64_t target = 0;
  {
    std::lock_guard lock(ev->m);
    target = ev->recorded;
  }
  if (target == 0) return;  // never recorded: nothing to wait for
  enqueue(s, [ev, target] {
    std::unique_lock lock(ev->m);
    ev->cv.wait(lock, [&] { return ev->completed >= target; });
  });
}

// ---- work ---------------------------------------------------------------------------------

// Note [Copy engines]
// A GPU has one DMA engine per direction: two H2D copies on different streams take turns,
// while an H2D and a D2H copy run at once, and both overlap kernels. The cpu backend keeps that
// shape: the copy runs on its stream's thread (so stream order holds) while holding the mutex
// of its direction's engine, and, when a link bandwidth is set, keeps the engine busy until
// bytes / bandwidth has passed since the copy started. A copy that follows another on the engine
// at once starts when that one was due to end, not when its thread woke: the engine then sleeps
// to each deadline without spinning (a sleep's overshoot is made up by the next copy), and a
// burst of copies moves at the link's rate. Only the last copy of a burst ends late, by one
// sleep's overshoot.
void cpu_device::run_copy(void* dst, const void* src, std::size_t bytes, copy_kind kind) {
  using namespace std::chrono;
  copied_[static_cast<std::size_t>(kind)].fetch_add(bytes, std::memory_order_relaxed);
  if (kind != copy_kind::host_to_device && kind != copy_kind::device_to_host) {
    std::memmove(dst, src, bytes);
    return;
  }
  auto& engine = engines_[kind == copy_kind::host_to_device ? 0 : 1];
  std::lock_guard busy(engine.busy);
  const auto now = steady_clock::now();
  std::memcpy(dst, src, bytes);
  const double bw = engine.bytes_per_second.load(std::memory_order_relaxed);
  if (bw > 0) {
    constexpr auto back_to_back = microseconds(200);  // more than a sleep overshoots
    const auto start = now - engine.due < back_to_back ? engine.due : now;
    engine.due = start + duration_cast<nanoseconds>(duration<double>(static_cast<double>(bytes) / bw));
    std::this_thread::sleep_until(engine.due);
  }
}

void cpu_device::copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream s) {
  if (bytes == 0) return;
  SPILLWAY_EXPECTS(dst != nullptr && src != nullptr, "cpu device: copy_async with a null pointer");
  enqueue(s, [this, dst, src, bytes, kind] { run_copy(dst, src, bytes, kind); });
}

void cpu_device::memset_async(void* dst, int value, std::size_t bytes, stream s) {
  if (bytes == 0) return;
  SPILLWAY_EXPECTS(dst != nullptr, "cpu device: memset_async with a null pointer");
  enqueue(s, [dst, value, bytes] { std::memset(dst, value, bytes); });
}

void cpu_device::launch_host(stream s, std::function<void()> work) { enqueue(s, std::move(work)); }

void cpu_device::set_link_bandwidth(double h2d, double d2h) {
  SPILLWAY_EXPECTS_T(config_error, h2d >= 0 && d2h >= 0, "cpu device: link bandwidth must be >= 0 bytes/s");
  engines_[0].bytes_per_second.store(h2d);
  engines_[1].bytes_per_second.store(d2h);
}

std::uint64_t cpu_device::copied_bytes(copy_kind kind) const noexcept {
  return copied_[static_cast<std::size_t>(kind)].load(std::memory_order_relaxed);
}

}  // namespace spillway
