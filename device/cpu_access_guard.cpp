// The guarded arena of the cpu backend's debug mode and the SIGSEGV handler that names a host
// access to it. See Note [Debug host access] in cpu_device.cpp.
#include "device/cpu_access_guard.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway::detail {
namespace {

constexpr std::size_t page = 4096;

// The arenas the handler knows, as [start, end) pairs; a slot is free when its start is 0. The
// handler only reads them (lock-free atomics are async-signal-safe).
constexpr int max_arenas = 256;
struct arena_range {
  std::atomic<std::uintptr_t> start{0};
  std::atomic<std::uintptr_t> end{0};
};
std::array<arena_range, max_arenas> arenas;
struct sigaction previous_action {};
std::once_flag handler_installed;

bool in_an_arena(std::uintptr_t a) noexcept {
  for (const auto& r : arenas) {
    const auto s = r.start.load(std::memory_order_acquire);
    if (s != 0 && a >= s && a < r.end.load(std::memory_order_acquire)) return true;
  }
  return false;
}

// Writes all of `text` to stderr with write(2), the one way to print from a signal handler.
void say(const char* text, std::size_t n) noexcept {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    text += w;
    n -= static_cast<std::size_t>(w);
  }
}

void die_by_default(int sig) noexcept {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  // The signal is blocked while its handler runs: it is delivered, with the default action, as
  // the handler returns. A fault that raise cannot stand for repeats at the same instruction.
  ::raise(sig);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const auto a = reinterpret_cast<std::uintptr_t>(info != nullptr ? info->si_addr : nullptr);
  if (info != nullptr && info->si_code > 0 && in_an_arena(a)) {
    char line[256];
    std::size_t n = 0;
    auto put = [&](const char* s) {
      while (*s != '\0' && n < sizeof line) line[n++] = *s++;
    };
    put("spillway: host code touched device memory at 0x");
    char hex[2 * sizeof a];
    int digits = 0;
    for (auto v = a; digits == 0 || v != 0; v >>= 4) hex[digits++] = "0123456789abcdef"[v & 0xf];
    while (digits > 0 && n < sizeof line) line[n++] = hex[--digits];
    put(" outside a kernel or op.run (cpu_debug_host_access); launch host work on the op's stream or use op.run\n");
    say(line, n);
    die_by_default(sig);
    errno = saved_errno;
    return;
  }
  // Not ours: what was there before us decides.
  const auto& prev = previous_action;
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    errno = saved_errno;
    prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler == SIG_IGN) {
    // Ignored before us: a signal sent by a process stays ignored; a fault cannot be ignored.
    if (info == nullptr || info->si_code > 0) die_by_default(sig);
  } else if (prev.sa_handler == SIG_DFL || prev.sa_handler == nullptr) {
    die_by_default(sig);
  } else {
    errno = saved_errno;
    prev.sa_handler(sig);
  }
  errno = saved_errno;
}

void install_handler() {
  std::call_once(handler_installed, [] {
    struct sigaction act {};
    act.sa_sigaction = on_fault;
    act.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&act.sa_mask);
    if (::sigaction(SIGSEGV, &act, &previous_action) != 0)
      throw error(std::string("cpu device: cannot install the SIGSEGV handler of debug_host_access: ") + std::strerror(errno));
  });
}

}  // namespace

guarded_arena::guarded_arena(std::size_t capacity) {
  // Twice the capacity (at least 1 GiB more) of address space: no memory until touched.
  const std::size_t reserve = round_up(capacity + std::max<std::size_t>(capacity, std::size_t{1} << 30), page);
  void* p = ::mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw out_of_memory("cpu device: cannot reserve " + format_bytes(reserve) +
                        " of address space for the guarded device memory of debug_host_access: " + std::strerror(errno));
  base_ = reinterpret_cast<std::uintptr_t>(p);
  span_ = reserve;
  free_.emplace(base_, span_);
  // Opening the arena once here is where a system that accounts every writable page
  // (vm.overcommit_memory=2 ignores MAP_NORESERVE) refuses it: a clear error now, not an abort
  // in the middle of stream work. Later opens are not charged again.
  if (::mprotect(p, span_, PROT_READ | PROT_WRITE) != 0 || ::mprotect(p, span_, PROT_NONE) != 0) {
    const int err = errno;
    ::munmap(p, span_);
    throw out_of_memory("cpu device: cannot make the " + format_bytes(reserve) +
                        " of guarded device memory of debug_host_access writable: " + std::strerror(err) +
                        "; give a smaller cpu_device_memory");
  }
  try {
    install_handler();
  } catch (...) {
    ::munmap(p, span_);
    throw;
  }
  for (int i = 0; i < max_arenas; ++i) {
    std::uintptr_t empty = 0;
    if (arenas[i].start.compare_exchange_strong(empty, base_, std::memory_order_acq_rel)) {
      arenas[i].end.store(base_ + span_, std::memory_order_release);  // 0 until now: no false match
      slot_ = i;
      break;
    }
  }
  // With every slot taken (hundreds of devices in debug mode at once) faults in this arena are
  // still faults, only without the line that names them.
}

guarded_arena::~guarded_arena() {
  if (slot_ >= 0) {
    arenas[slot_].end.store(0, std::memory_order_release);
    arenas[slot_].start.store(0, std::memory_order_release);
  }
  ::munmap(reinterpret_cast<void*>(base_), span_);
}

bool guarded_arena::contains(const void* p) const noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return a >= base_ && a < base_ + span_;
}

void* guarded_arena::allocate(std::size_t bytes, std::size_t alignment) noexcept {
  std::lock_guard lock(free_mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const auto [start, size] = *it;
    const std::uintptr_t at = round_up(start, alignment);
    if (at + bytes > start + size) continue;
    free_.erase(it);
    if (at > start) free_.emplace(start, at - start);
    if (at + bytes < start + size) free_.emplace(at + bytes, start + size - (at + bytes));
    return reinterpret_cast<void*>(at);
  }
  return nullptr;
}

void guarded_arena::deallocate(void* p, std::size_t bytes) noexcept {
  auto start = reinterpret_cast<std::uintptr_t>(p);
  auto end = start + bytes;
  std::lock_guard lock(free_mutex_);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      free_.erase(prev);
    }
  }
  free_.emplace(start, end - start);
  // The pages wholly free go back to the system (no access needed: madvise ignores protection);
  // a page shared with a live neighbour keeps its bytes.
  const std::uintptr_t first = round_up(start, page);
  const std::uintptr_t last = end / page * page;
  if (last > first) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void guarded_arena::protect(int prot) noexcept {
  // Cannot fail on a whole mapping of ours short of the kernel running out of memory for its
  // page tables; then carrying on would report false faults or miss true ones.
  if (::mprotect(reinterpret_cast<void*>(base_), span_, prot) != 0) std::abort();
}

void guarded_arena::enter() noexcept {
  std::lock_guard lock(access_mutex_);
  if (inside_++ == 0) protect(PROT_READ | PROT_WRITE);
}

void guarded_arena::leave() noexcept {
  std::lock_guard lock(access_mutex_);
  if (--inside_ == 0) protect(PROT_NONE);
}

}  // namespace spillway::detail
