// A small lock for the caching allocator's short critical sections (tens of nanoseconds).
// Spins briefly, then yields, so a preempted holder does not make waiters burn a core.
#pragma once

#include <atomic>
#include <thread>

namespace spillway::detail {

class spin_mutex {
 public:
  void lock() noexcept {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire); ++spins) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
  }
  bool try_lock() noexcept { return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace spillway::detail
