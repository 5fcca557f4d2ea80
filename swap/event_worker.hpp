// event_worker: a thread that runs jobs once device events are reached, so that no host function
// has to (host functions share one callback thread and may neither call the Device nor wait).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "swap/move_handle.hpp"

namespace spillway {

/// Runs each job on its own thread after the job's device event is reached, in the order the
/// jobs were given (a job waits behind the one before it, even on another stream: use it for
/// follow-up work such as freeing a staging block or starting a file write, never for work a
/// stream waits on). The thread is an ordinary one: a job may call the Device and block.
class event_worker {
 public:
  /// Gets the device's error when waiting for the event failed (a sticky device failure),
  /// else null. Must not throw.
  using job = std::function<void(std::exception_ptr)>;

  event_worker() : thread_([this] { serve(); }) {}
  ~event_worker() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // serve() runs every job given before it returns
  }
  event_worker(const event_worker&) = delete;
  event_worker& operator=(const event_worker&) = delete;

  /// Runs `j` once `mark`'s event is reached; an abandoned mark runs it at once (in order).
  void after(std::shared_ptr<detail::device_mark> mark, job j) {
    {
      std::lock_guard lock(m_);
      jobs_.push_back(item{std::move(mark), std::move(j)});
      ++given_;
    }
    cv_.notify_all();
  }
  /// Blocks until every job given before the call has run.
  void drain() {
    std::unique_lock lock(m_);
    const auto target = given_;
    cv_.wait(lock, [&] { return ran_ >= target; });
  }

 private:
  struct item {
    std::shared_ptr<detail::device_mark> mark;
    job run;
  };
  void serve() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_, and nothing left
      item it = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      std::exception_ptr err;
      try {
        if (it.mark->wait_settled()) it.mark->device->synchronize_event(it.mark->ev);
      } catch (...) {
        err = std::current_exception();
      }
      try {
        it.run(std::move(err));  // Note [Errors that cross threads]
      } catch (...) {  // NOLINT(bugprone-empty-catch): a job must not throw; nothing to report to
      }
      it = item{};  // drops the event here, on this thread, before the job counts as run
      lock.lock();
      ++ran_;
      cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<item> jobs_;
  std::uint64_t given_ = 0;
  std::uint64_t ran_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace spillway
