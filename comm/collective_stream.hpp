// collective_stream: collectives on a thread of their own, ordered after device work by events,
// so that they overlap the compute enqueued after them (Note [Collective streams]).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "device/device.hpp"
#include "device/event_pool.hpp"

namespace spillway::comm {

/// Note [Collective streams]
/// A collective waits for the other ranks, for as long as the slowest takes to get there. Run on
/// the thread that issues the device's work, it would hold that work back; run as a device host
/// function, it would hold every stream's host functions back (they share one thread, on a GPU
/// as on the strict cpu backend). So a collective_stream keeps a thread of its own: each job is
/// queued behind an event recorded on a device stream at the point where its input is ready, and
/// the thread runs the jobs one after another, each once the device has reached its event. The
/// caller goes on issuing work meanwhile, and waits for a job (wait(ticket)) only before it
/// issues the work that reads the job's output. The first job to throw fails the stream: the
/// jobs queued after it are dropped (the ranks no longer agree on what comes next), and every
/// wait from then on rethrows that error. The jobs are the only callers of their communicator
/// while they run; the caller reaches the communicator itself only after wait_all().
class collective_stream {
 public:
  using ticket = std::uint64_t;

  explicit collective_stream(Device& device);
  /// Waits for the queued jobs (their errors are dropped; wait_all() first to see them).
  ~collective_stream();
  collective_stream(const collective_stream&) = delete;
  collective_stream& operator=(const collective_stream&) = delete;

  /// Queues `job` to run on the stream's thread once the device has done the work enqueued on
  /// `after` so far (an event is recorded on it now) and every job queued before has run. Returns
  /// the job's ticket, counting from 1. usage_error for an empty job; the stream's error, if a
  /// job has failed.
  ticket enqueue(stream after, std::function<void()> job);
  /// Returns once job `t` (and every job before it) has run; rethrows the stream's error.
  void wait(ticket t);
  /// wait() for the last job queued.
  void wait_all();
  /// Jobs queued so far, and jobs run so far.
  [[nodiscard]] std::uint64_t queued() const;
  [[nodiscard]] std::uint64_t done() const;

 private:
  struct job {
    event ready;
    std::function<void()> work;
  };
  void run();

  Device* device_;
  event_pool events_;  // one event per job, taken at enqueue and given back once it has run
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<job> jobs_;
  std::uint64_t queued_ = 0;
  std::uint64_t done_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace spillway::comm
