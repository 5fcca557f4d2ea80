// The cpu backend's memory, streams, events and copies.
// See Note [Copy engines] for how copies overlap, Note [Events] for event generations, and
// cpu_callbacks.cpp for the callback thread that runs host functions (Note [Host functions]).
#include "device/cpu_device.hpp"

#include <sys/mman.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "device/cpu_device_detail.hpp"
#include "device/error.hpp"
#include "device/huge_pages.hpp"
#include "device/stream_work.hpp"
#include "device/units.hpp"

namespace spillway {

namespace {

std::string format_pointer(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}
constexpr std::size_t device_alignment = 256;
constexpr std::size_t page = 4096;

std::size_t default_capacity(const device_options& o) {
  return o.cpu_device_memory != 0 ? o.cpu_device_memory : std::size_t{1} << 30;
}

std::uint64_t default_seed(std::uint64_t given) { return given != 0 ? given : 1; }

// Sleeps until just before `deadline`, then spins the last few tens of microseconds. Stream
// threads run with a 1 us timer slack (see serve); spinning longer would steal the core that
// another stream's work needs on a small machine.
void wait_until(std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  std::this_thread::sleep_until(deadline - microseconds(60));  // a sleep overshoots by ~60 us
  while (steady_clock::now() < deadline) {
  }
}

// How often a waiter looks at the wedged flag (Note [Host functions]); only waits that last
// this long pay for it.
constexpr auto wedge_poll = std::chrono::milliseconds(50);
}  // namespace

cpu_device::cpu_device(const device_options& options)
    : rules_(options.strict),
      capacity_(default_capacity(options)),
      pinned_huge_pages_(options.pinned_huge_pages),
      callback_order_(default_seed(options.strict.callback_seed)) {
  props_.name = "cpu (emulated device, " + format_bytes(capacity_) + ")";
  props_.backend = backend::cpu;
  props_.total_memory = capacity_;
  props_.copy_engines = 2;
  props_.numa_node = -1;
  set_link_bandwidth(options.h2d_bytes_per_second, options.d2h_bytes_per_second);
  if (rules_.host_function_limit.count() < 0)
    throw config_error("cpu device: device_options.strict.host_function_limit is " +
                       std::to_string(rules_.host_function_limit.count()) + " ms; it must be >= 0 (0: wait forever)");
  if (options.debug_host_access) arena_ = std::make_unique<detail::guarded_arena>(capacity_);
  if (rules_.one_callback_thread) callback_thread_ = std::thread([this] { serve_callbacks(); });
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
  if (callback_thread_.joinable()) {
    bool stuck = false;
    {
      std::unique_lock lock(callbacks_mutex_);
      callbacks_stopping_ = true;
      if (wedged_) callbacks_done_.wait_for(lock, std::chrono::seconds(1), [&] { return running_call_ == nullptr; });
      stuck = running_call_ != nullptr;
    }
    callbacks_work_.notify_all();
    // A host function that never returns keeps the thread; joining it would hang the program
    // that the wedge error already told what went wrong.
    if (stuck) callback_thread_.detach();
    else callback_thread_.join();
    // The host function left behind may still touch device memory: the arena stays mapped,
    // with its blocks.
    if (stuck && arena_) {
      (void)arena_.release();
      device_blocks_.clear();
    }
  }
  for (auto& [p, n] : device_blocks_) release_block(reinterpret_cast<void*>(p), n);
  for (auto& [p, n] : pinned_blocks_) ::munmap(reinterpret_cast<void*>(p), round_up(n, page));
}

// ---- failures and callers --------------------------------------------------------------------

void cpu_device::fail(std::exception_ptr e) noexcept {
  std::lock_guard lock(failure_mutex_);
  if (!sticky_) sticky_ = std::move(e);
}

void cpu_device::rethrow_sticky() const {
  std::exception_ptr e;
  {
    std::lock_guard lock(failure_mutex_);
    if (rules_.sticky_errors || wedged_) e = sticky_;
  }
  if (e) std::rethrow_exception(e);
}

void cpu_device::check_caller(const char* call) const {
  if (!rules_.no_device_calls_in_stream_work) return;
  const char* what = detail::stream_work_context();
  SPILLWAY_EXPECTS_T(usage_error, what == nullptr,
                     std::string("cpu device: ") + call + " called from " + what +
                         "; stream work must not call the Device (CUDA refuses API calls in host functions, and a "
                         "kernel cannot make them): do it on a host thread before or after the stream work");
}

// ---- memory -------------------------------------------------------------------------------

// Note [Debug host access]
// On a GPU, host code cannot read device memory: a C training loop ported by calling its host
// functions on device pointers inside an op scope crashes at once. On the cpu backend device
// memory is host memory, so the same code runs, and races with the stream work that writes those
// bytes: wrong values, NaN, a crash far away. device_options::debug_host_access (the Session's
// cpu_debug_host_access) makes such code fail where it goes wrong:
//  * Device memory comes from one mapping (detail::guarded_arena, cpu_access_guard.cpp) kept
//    PROT_NONE while no stream work of the device runs. A stream's worker opens it (mprotect
//    read/write) around each kernel, copy, memset and host function, and closes it after; the
//    opens are counted under a mutex, so workers of several streams compose (the first in
//    unprotects, the last out protects). Event marks and waits do not open it. The callback
//    thread opens it too around a host function, so launch_host is the way to run host code on
//    device memory, which is what the Session's op.run does: it enqueues the function on the
//    op's stream and synchronises.
//  * The backend itself touches device memory only from stream work: copies, pageable ones
//    included, run on the stream's worker while the caller waits (a pageable source, host
//    memory, is staged on the caller's thread, Note [Pageable copies]); allocate and deallocate keep
//    their bookkeeping outside the arena and never read it; a freed range's whole pages go
//    back to the system with madvise, which needs no access.
//  * A SIGSEGV handler (installed with the first such device, chained to the one before it for
//    every address outside the arenas) writes one line for a fault inside an arena,
//    "spillway: host code touched device memory at 0x... outside a kernel or op.run
//    (cpu_debug_host_access); ...", with write(2), then restores the default action and lets
//    the signal kill the process. Library code never prints; this line, in a mode a user asks
//    for to find exactly this bug, is the one exception, since a signal handler has no other
//    way to say why the program died.
// It is probabilistic: the protection is per process, not per thread (this machine's CPUs
// have no memory protection keys), so a host access made while some stream work of the device
// happens to run is not caught. A loop that touches device memory every op is caught within a
// few ops; one stray access may slip through. It costs two mprotect calls per busy period of
// the device and the arena's address space (twice the capacity, untouched pages free), so it
// is a debug mode, off by default.

void* cpu_device::allocate(std::size_t bytes) {
  check_caller("allocate");
  if (bytes == 0) return nullptr;
  const std::size_t rounded = round_up(bytes, device_alignment);
  std::lock_guard lock(memory_mutex_);
  if (rounded > capacity_ - used_) {
    throw out_of_memory("cpu device: out of memory allocating " + format_bytes(bytes) + " (" +
                        format_bytes(used_) + " of " + format_bytes(capacity_) + " in use)");
  }
  void* p = arena_ ? arena_->allocate(rounded, device_alignment) : std::aligned_alloc(device_alignment, rounded);
  if (p == nullptr)
    throw out_of_memory("cpu device: host allocation of " + format_bytes(rounded) + " failed" +
                        (arena_ ? " (no free range of the guarded arena of debug_host_access is large enough)" : ""));
  used_ += rounded;
  device_blocks_.emplace(reinterpret_cast<std::uintptr_t>(p), rounded);
  return p;
}

void cpu_device::deallocate(void* ptr, std::size_t /*bytes*/) noexcept {
  if (ptr == nullptr) return;
  bool from_stream_work = false;
  try {
    check_caller("deallocate");
  } catch (...) {
    fail(std::current_exception());
    from_stream_work = true;
  }
  if (rules_.free_synchronizes && !from_stream_work) {
    synchronizing_frees_.fetch_add(1, std::memory_order_relaxed);
    drain_all();  // as cudaFree: the device finishes all its work first
  }
  std::lock_guard lock(memory_mutex_);
  auto it = device_blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == device_blocks_.end()) std::abort();  // freeing memory this device did not hand out
  used_ -= it->second;
  release_block(ptr, it->second);
  device_blocks_.erase(it);
}

void cpu_device::release_block(void* p, std::size_t bytes) noexcept {
  // Neither touches the bytes: the arena keeps its bookkeeping outside device memory.
  if (arena_) arena_->deallocate(p, bytes);
  else std::free(p);
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
  check_caller("allocate_pinned");
  if (bytes == 0) return nullptr;
  void* p = ::mmap(nullptr, round_up(bytes, page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw out_of_memory("cpu device: cannot map " + format_bytes(bytes) + " of pinned host memory: " + std::strerror(errno));
  // Huge pages must be asked for before the pages are pinned: pinned pages cannot be collapsed
  // (Note [Huge pages for registered buffers]); the pages that pinning faults in come huge.
  if (pinned_huge_pages_) (void)detail::back_with_huge_pages(p, round_up(bytes, page));
  std::lock_guard lock(memory_mutex_);
  pinned_blocks_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  return p;
}

void cpu_device::deallocate_pinned(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  try {
    check_caller("deallocate_pinned");
  } catch (...) {
    fail(std::current_exception());
  }
  std::size_t n = 0;
  {
    std::lock_guard lock(memory_mutex_);
    auto it = pinned_blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == pinned_blocks_.end()) std::abort();
    n = it->second;
    pinned_blocks_.erase(it);
  }
  // The CUDA backend unmaps the size given, so another size would leak the mapping or unmap a
  // neighbour there: a failure here (sticky, as a GPU's would be), and the block goes whole.
  if (bytes != n) {
    fail(std::make_exception_ptr(usage_error("deallocate_pinned: given " + std::to_string(bytes) + " bytes for a block of " +
                                             std::to_string(n) + "; give the size allocate_pinned was asked for")));
  }
  ::munmap(ptr, round_up(n, page));
}

namespace {

// Whether [p, p + bytes) lies inside one of `blocks` (start -> bytes).
bool inside_one(const std::map<std::uintptr_t, std::size_t>& blocks, const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = blocks.upper_bound(a);
  if (it == blocks.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

}  // namespace

bool cpu_device::is_pinned(const void* p, std::size_t bytes) const {
  std::lock_guard lock(memory_mutex_);
  return inside_one(pinned_blocks_, p, bytes);
}

bool cpu_device::is_device(const void* p, std::size_t bytes) const {
  std::lock_guard lock(memory_mutex_);
  return inside_one(device_blocks_, p, bytes);
}

bool cpu_device::touches_device(const void* p, std::size_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(memory_mutex_);
  auto it = device_blocks_.lower_bound(a + bytes);  // the first block starting at or past the end
  if (it == device_blocks_.begin()) return false;
  --it;  // the last block starting before the end
  return it->first + it->second > a;
}

// Note [Copy kinds]
// cudaMemcpyAsync with an explicit kind whose pointers do not match it (a host pointer where
// the kind says device memory, or device memory where it says host) is undefined: with unified
// addressing it may work, fail with an invalid value, or fault in a kernel later. Here device
// memory is host memory, so such a copy would always work. With copy_kinds_checked the backend
// refuses it at the call, naming the side that is wrong, so the mistake shows on the machine
// where the tests run and not on the first GPU. Host memory is anything outside this device's
// blocks, pinned or not.
void cpu_device::check_copy_kind(const void* dst, const void* src, std::size_t bytes, copy_kind kind) const {
  const bool dst_device = kind == copy_kind::host_to_device || kind == copy_kind::device_to_device;
  const bool src_device = kind == copy_kind::device_to_host || kind == copy_kind::device_to_device;
  auto check = [&](const void* p, bool device, const char* side) {
    const bool ok = device ? is_device(p, bytes) : !touches_device(p, bytes);
    if (ok) return;
    throw usage_error(std::string("cpu device: copy_async ") + to_string(kind) + " of " + format_bytes(bytes) + ": the " +
                      side + " " + format_pointer(p) +
                      (device ? " is not inside one block of this device's memory; give a pointer allocate() returned, "
                                "with the copy inside its block, or the copy kind that matches the memory"
                              : " is device memory; give host memory, or the copy kind that matches the memory"));
  };
  check(dst, dst_device, "destination");
  check(src, src_device, "source");
}

// ---- streams ------------------------------------------------------------------------------

void cpu_device::serve(stream_impl& q) {
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: timed copies and delays wake on time
  for (;;) {
    work_item item;
    std::chrono::nanoseconds delay{};
    {
      std::unique_lock lock(q.m);
      q.work.wait(lock, [&] { return q.stopping || !q.queue.empty(); });
      if (q.queue.empty()) return;  // stopping and drained
      item = std::move(q.queue.front());
      q.queue.pop_front();
      delay = q.delay;
    }
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr failure;
    // After a sticky failure the device runs no more user work, as a CUDA context after an
    // error; event marks still run so that nothing waits on them forever.
    bool skip = false;
    if (!item.marker && rules_.sticky_errors) {
      std::lock_guard lock(failure_mutex_);
      skip = sticky_ != nullptr;
    }
    if (!skip) {
      // Event marks touch no device memory, and a wait may be long: only real work opens the
      // arena (Note [Debug host access]).
      detail::guarded_arena::access access(item.marker ? nullptr : arena_.get());
      try {
        if (item.host_function) {
          run_host_function(q, std::move(item.fn));
        } else {
          detail::stream_work_scope scope(item.marker ? "an event mark" : "a cpu kernel or copy");
          // Its captures die inside the scope, thrown or not, as those of a host function do on
          // CUDA (where launch_kernel is one): a capture whose destructor calls the Device is
          // refused here as it is there.
          const struct release {
            std::function<void()>& fn;
            ~release() { fn = nullptr; }
          } release_after{item.fn};
          item.fn();
        }
      } catch (...) {
        failure = std::current_exception();
      }
    }
    item.fn = nullptr;  // captures die on the stream's thread, before the item counts as done (a
                        // host function's, or work skipped after a sticky failure)
    if (delay.count() > 0) wait_until(start + delay);
    if (failure) {
      if (rules_.sticky_errors) fail(failure);
    }
    bool drained = false;
    {
      std::lock_guard lock(q.m);
      // Moved: the caller may read and drop it before this thread would let go (Note [Errors
      // that cross threads]).
      if (failure && !rules_.sticky_errors && !q.error) q.error = std::move(failure);
      drained = --q.pending == 0;
    }
    // Only a drained queue is news to synchronize_stream: waking it after every item would cost
    // a context switch per item while the host waits for a long queue.
    if (drained) q.drained.notify_all();
  }
}

stream cpu_device::create_stream(stream_priority priority, default_stream_order /*order*/) {
  // No default stream here: nothing runs outside the streams created here, so order changes nothing.
  check_caller("create_stream");
  std::lock_guard lock(streams_mutex_);
  auto& q = streams_.emplace_back();
  q.priority = priority;
  q.number = ++next_stream_id_;
  q.label = "stream " + std::to_string(q.number) + " (" +
            (priority == stream_priority::high ? "high" : priority == stream_priority::low ? "low" : "normal") +
            " priority)";
  q.worker = std::thread([this, &q] { serve(q); });
  return stream{&q};
}

cpu_device::stream_impl& cpu_device::impl(stream s) const {
  SPILLWAY_EXPECTS_T(usage_error, s.handle != nullptr, "cpu device: a null stream handle (not one create_stream made)");
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

void cpu_device::enqueue(stream s, std::function<void()> work, bool host_function, bool marker) {
  auto& q = impl(s);
  {
    std::lock_guard lock(q.m);
    SPILLWAY_EXPECTS_T(usage_error, !q.stopping, "cpu device: work enqueued on a stream being destroyed");
    q.queue.push_back(work_item{std::move(work), host_function, marker});
    ++q.pending;
  }
  q.work.notify_one();  // only the stream's own thread waits for work
}

void cpu_device::wait_drained(stream_impl& q) const {
  std::unique_lock lock(q.m);
  while (q.pending != 0) {
    if (wedged_) return;  // a blocked host function holds work that will never end
    q.drained.wait_for(lock, wedge_poll);
  }
}

void cpu_device::synchronize_stream(stream s) {
  check_caller("synchronize_stream");
  auto& q = impl(s);
  wait_drained(q);
  rethrow_sticky();
  std::exception_ptr failure;
  {
    std::lock_guard lock(q.m);
    std::swap(failure, q.error);
  }
  if (failure) std::rethrow_exception(failure);
}

void cpu_device::drain_all() noexcept {
  std::lock_guard lock(streams_mutex_);  // streams are not destroyed while we wait on them
  for (auto& q : streams_) wait_drained(q);
}

void cpu_device::synchronize() {
  check_caller("synchronize");
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

// Note [Events]
// An event keeps two counters. record_event bumps `recorded` and enqueues a mark that raises
// that generation off the event's outstanding list when the stream reaches it. The event is
// finished when its latest generation is reached. Generations are reached one by one, not up to
// a count: an event may be recorded again, on another stream, while an earlier record is still
// pending (an event pool reuses events so), and the later record reaching the device says
// nothing of the earlier one. stream_wait_event captures the generation at the time of the call, so
// a later re-record does not change what an earlier wait waits for (as in CUDA). A timing
// event also notes when its mark ran.

// The handle points at a shared_ptr so that work already enqueued keeps the event alive when
// it is destroyed early, as cudaEventDestroy allows.
using event_ref = std::shared_ptr<cpu_device::event_impl>;

event cpu_device::create_event() {
  check_caller("create_event");
  return event{new event_ref(std::make_shared<event_impl>())};
}

event cpu_device::create_timing_event() {
  check_caller("create_timing_event");
  auto ev = std::make_shared<event_impl>();
  ev->timing = true;
  return event{new event_ref(std::move(ev))};
}

void cpu_device::destroy_event(event e) noexcept { delete static_cast<event_ref*>(e.handle); }

std::shared_ptr<cpu_device::event_impl> cpu_device::impl(event e) {
  SPILLWAY_EXPECTS_T(usage_error, e.handle != nullptr, "cpu device: a null event handle (not one create_event made)");
  return *static_cast<event_ref*>(e.handle);
}

void cpu_device::record_event(event e, stream s) {
  check_caller("record_event");
  auto ev = impl(e);
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(ev->m);
    generation = ++ev->recorded;
    ev->outstanding.push_back(generation);
  }
  auto unrecord = [&] {
    std::lock_guard lock(ev->m);
    std::erase(ev->outstanding, generation);
  };
  try {
    enqueue_mark(s, ev, generation);
  } catch (...) {
    unrecord();  // never enqueued: nothing may wait for it
    throw;
  }
}

void cpu_device::enqueue_mark(stream s, const std::shared_ptr<event_impl>& ev, std::uint64_t generation) {
  enqueue(
      s,
      [ev, generation] {
        {
          std::lock_guard lock(ev->m);
          std::erase(ev->outstanding, generation);
          if (generation == ev->recorded && ev->timing) ev->completed_at = std::chrono::steady_clock::now();
        }
        ev->cv.notify_all();
      },
      false, true);
}

bool cpu_device::query_event(event e) {
  check_caller("query_event");
  rethrow_sticky();
  auto ev = impl(e);
  std::lock_guard lock(ev->m);
  return ev->reached(ev->recorded);
}

void cpu_device::wait_event(event_impl& ev, std::uint64_t target) const {
  std::unique_lock lock(ev.m);
  while (!ev.reached(target)) {
    if (wedged_) return;
    ev.cv.wait_for(lock, wedge_poll);
  }
}

void cpu_device::synchronize_event(event e) {
  check_caller("synchronize_event");
  auto ev = impl(e);
  std::uint64_t target = 0;
  {
    std::lock_guard lock(ev->m);
    target = ev->recorded;
  }
  wait_event(*ev, target);
  rethrow_sticky();
}

void cpu_device::stream_wait_event(stream s, event e) {
  check_caller("stream_wait_event");
  auto ev = impl(e);
  std::uint64_t target = 0;
  {
    std::lock_guard lock(ev->m);
    target = ev->recorded;
  }
  if (target == 0) return;  // never recorded: nothing to wait for
  enqueue(s, [this, ev, target] { wait_event(*ev, target); }, false, true);
}

double cpu_device::elapsed_ms(event start, event end) {
  check_caller("elapsed_ms");
  auto a = impl(start);
  auto b = impl(end);
  auto reached = [](event_impl& ev, std::chrono::steady_clock::time_point& at) {
    std::lock_guard lock(ev.m);
    at = ev.completed_at;
    return ev.timing && ev.recorded > 0 && ev.reached(ev.recorded);
  };
  std::chrono::steady_clock::time_point ta, tb;
  SPILLWAY_EXPECTS_T(usage_error, reached(*a, ta) && reached(*b, tb),
                     "cpu device: elapsed_ms needs two timing events, both recorded and reached");
  return std::chrono::duration<double, std::milli>(tb - ta).count();
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
// A timed copy moves its bytes at the end of its time, not at the start: on a GPU the
// destination fills while the copy runs and the source is read until it ends, so code that
// reads the destination or overwrites the source before the copy is done must see it go wrong
// here too. The engine sleeps until the deadline less the time its last memcpy took per byte,
// then copies, so the copy still ends about when the link would have it end.
void cpu_device::run_copy(void* dst, const void* src, std::size_t bytes, copy_kind kind) {
  using namespace std::chrono;
  copied_[static_cast<std::size_t>(kind)].fetch_add(bytes, std::memory_order_relaxed);
  if (kind != copy_kind::host_to_device && kind != copy_kind::device_to_host) {
    std::memmove(dst, src, bytes);
    return;
  }
  auto& engine = engines_[kind == copy_kind::host_to_device ? 0 : 1];
  std::lock_guard busy(engine.busy);
  const double bw = engine.bytes_per_second.load(std::memory_order_relaxed);
  if (bw <= 0) {
    std::memcpy(dst, src, bytes);
    return;
  }
  constexpr auto back_to_back = microseconds(200);  // more than a sleep overshoots
  const auto now = steady_clock::now();
  const auto start = now - engine.due < back_to_back ? engine.due : now;
  const auto seconds = [&](double rate) {
    return duration_cast<nanoseconds>(duration<double>(static_cast<double>(bytes) / rate));
  };
  engine.due = start + seconds(bw);
  const auto lead = engine.memcpy_bytes_per_second > 0 ? seconds(engine.memcpy_bytes_per_second) : nanoseconds{0};
  std::this_thread::sleep_until(std::max(start, engine.due - lead));
  const auto copy_start = steady_clock::now();
  std::memcpy(dst, src, bytes);
  const double took = duration<double>(steady_clock::now() - copy_start).count();
  if (bytes >= 64 * 1024 && took > 0) engine.memcpy_bytes_per_second = static_cast<double>(bytes) / took;
  std::this_thread::sleep_until(engine.due);
}

void cpu_device::copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream s) {
  check_caller("copy_async");
  if (bytes == 0) return;
  SPILLWAY_EXPECTS_T(usage_error, dst != nullptr && src != nullptr, "cpu device: copy_async with a null pointer");
  rethrow_sticky();
  // Note [Pageable copies]: CUDA cannot DMA from or to memory that is not pinned; it stages the
  // bytes. A copy to such memory returns only when it is done (the stream's earlier work first);
  // one from it returns once the bytes are staged, and may or may not wait for the stream. This
  // backend always waits: code that would deadlock where CUDA waits deadlocks here too.
  if (rules_.copy_kinds_checked) check_copy_kind(dst, src, bytes, kind);
  bool pageable = false;
  std::shared_ptr<std::vector<unsigned char>> staged;
  if (rules_.pageable_copies_synchronous) {
    const bool src_host = kind == copy_kind::host_to_device || kind == copy_kind::host_to_host;
    const bool dst_host = kind == copy_kind::device_to_host || kind == copy_kind::host_to_host;
    const bool src_pageable = src_host && !is_pinned(src, bytes);
    pageable = src_pageable || (dst_host && !is_pinned(dst, bytes));
    // CUDA stages a pageable source as the call runs, perhaps before the stream's earlier work
    // is done: bytes that work writes into it are not what the copy sends. Taken here too, so a
    // loop that counts on them fails on this backend as well. On an idle stream the copy runs
    // at once while the caller waits, so the bytes are the call's without a staging copy.
    bool busy = false;
    if (src_pageable) {
      auto& q = impl(s);
      std::lock_guard lock(q.m);
      busy = q.pending > 0;
    }
    if (busy) {
      const auto* from = static_cast<const unsigned char*>(src);
      staged = std::make_shared<std::vector<unsigned char>>(from, from + bytes);
    }
  }
  if (staged)
    enqueue(s, [this, dst, staged, kind] { run_copy(dst, staged->data(), staged->size(), kind); });
  else
    enqueue(s, [this, dst, src, bytes, kind] { run_copy(dst, src, bytes, kind); });
  if (pageable) {
    synchronous_copies_.fetch_add(1, std::memory_order_relaxed);
    wait_drained(impl(s));
    rethrow_sticky();
  }
}

void cpu_device::memset_async(void* dst, int value, std::size_t bytes, stream s) {
  check_caller("memset_async");
  if (bytes == 0) return;
  SPILLWAY_EXPECTS_T(usage_error, dst != nullptr, "cpu device: memset_async with a null pointer");
  if (rules_.copy_kinds_checked && !is_device(dst, bytes) && !is_pinned(dst, bytes))
    throw usage_error("cpu device: memset_async of " + format_bytes(bytes) + " at " + format_pointer(dst) +
                      ": not inside one block of this device's memory or of pinned memory; give a pointer allocate() "
                      "or allocate_pinned() returned, with the range inside its block (Note [Copy kinds])");
  rethrow_sticky();
  enqueue(s, [dst, value, bytes] { std::memset(dst, value, bytes); });
}

void cpu_device::launch_host(stream s, std::function<void()> work) {
  check_caller("launch_host");
  rethrow_sticky();
  enqueue(s, std::move(work), true);
}

void cpu_device::launch_kernel(stream s, std::function<void()> work) {
  check_caller("launch_kernel");
  rethrow_sticky();
  enqueue(s, [this, w = std::move(work)] {
    kernels_.fetch_add(1, std::memory_order_relaxed);
    w();
  });
}

void cpu_device::set_link_bandwidth(double h2d, double d2h) {
  if (!(h2d >= 0 && d2h >= 0))
    throw config_error("cpu device: link bandwidth (device_options h2d_bytes_per_second, d2h_bytes_per_second) is " +
                       std::to_string(h2d) + " and " + std::to_string(d2h) + " bytes/s; each must be >= 0 (0: unlimited)");
  engines_[0].bytes_per_second.store(h2d);
  engines_[1].bytes_per_second.store(d2h);
}

std::uint64_t cpu_device::copied_bytes(copy_kind kind) const noexcept {
  return copied_[static_cast<std::size_t>(kind)].load(std::memory_order_relaxed);
}

cpu_device_counters cpu_device::counters() const noexcept {
  return cpu_device_counters{host_functions_.load(), kernels_.load(), synchronous_copies_.load(),
                             synchronizing_frees_.load()};
}

}  // namespace spillway
