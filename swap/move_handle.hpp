// move_handle: the result of an asynchronous move between tiers. Wait on it on the host, or
// make a device stream wait for it, so the executor can chain GPU copies and file I/O.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "device/device.hpp"
#include "device/error.hpp"
#include "device/event_pool.hpp"

namespace spillway {

namespace detail {
/// Completion of the host part of one move (its file I/O and bookkeeping). finish() is called
/// once, from whichever thread ends that part (an I/O thread, a worker thread, or the caller).
/// Stream work (host functions) may hold a move_state: finishing it only sets a flag and
/// notifies.
struct move_state {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) noexcept {
    {
      std::lock_guard lock(m);
      error = std::move(e);
      done = true;
    }
    cv.notify_all();
  }
  void wait_done() {
    std::unique_lock lock(m);
    cv.wait(lock, [this] { return done; });
  }
  [[nodiscard]] bool is_done() {
    std::lock_guard lock(m);
    return done;
  }
};

/// The device event recorded on a stream right after a move's copy onto (or off) the device.
/// It may be recorded later than the move starts (after a file read, by an I/O thread), so it
/// also says whether it has been recorded yet; a stream wait on an event not yet recorded does
/// not wait, so nobody may wait on it before then. Owned by the move's handles and by the
/// threads that record it, never by stream work: making and ending it calls the Device.
struct device_mark {
  explicit device_mark(std::shared_ptr<event_pool> p) : device(&p->device()), ev(p->take()), pool(std::move(p)) {}
  ~device_mark() { pool->give(ev); }
  device_mark(const device_mark&) = delete;
  device_mark& operator=(const device_mark&) = delete;

  /// Records the event on `s` after the work enqueued there so far (the copy). When the device
  /// refuses, the mark is settled unrecorded (nobody waits on it for ever) and the error thrown.
  void record(stream s) {
    try {
      device->record_event(ev, s);
    } catch (...) {
      settle(false);
      throw;
    }
    settle(true);
  }
  /// The move failed before its copy was enqueued: there is nothing to wait for on the device.
  void abandon() noexcept { settle(false); }
  /// Blocks until record() or abandon(); true when the event was recorded.
  bool wait_settled() {
    std::unique_lock lock(m);
    cv.wait(lock, [this] { return settled; });
    return recorded;
  }
  [[nodiscard]] bool is_recorded() {
    std::lock_guard lock(m);
    return recorded;
  }
  /// True once the device has reached the event; remembered, so that polling a finished move
  /// (as retired copies are, on every save) costs no more Device calls.
  [[nodiscard]] bool reached() {
    if (done.load(std::memory_order_acquire)) return true;
    if (!device->query_event(ev)) return false;
    done.store(true, std::memory_order_release);
    return true;
  }

  Device* device;
  event ev;

 private:
  void settle(bool was_recorded) noexcept {
    {
      std::lock_guard lock(m);
      recorded = was_recorded;
      settled = true;
    }
    cv.notify_all();
  }
  std::shared_ptr<event_pool> pool;
  std::mutex m;
  std::condition_variable cv;
  bool settled = false;
  bool recorded = false;
  std::atomic<bool> done{false};
};

inline std::shared_ptr<device_mark> make_mark(const std::shared_ptr<event_pool>& pool) {
  return std::make_shared<device_mark>(pool);
}
}  // namespace detail

/// A handle to one move. Cheap to copy; all copies refer to the same move.
///
/// A move has a host part (file I/O, bookkeeping; `state`) and may have a device part: a copy
/// on a stream followed by the handle's device event (`mark`). The move is finished when
/// ready(): its destination holds the bytes (verified by CRC32C when read from NVMe) and its
/// source copy has been released, or it failed, the tensor is still where it was, and error()
/// says why (an io_error naming the tensor).
///
/// Waiting on a device stream (stream_wait) never enqueues a host function, because host
/// functions share one callback thread and must never wait for other work:
///  * a move with a device event: the caller's thread waits until the event is recorded
///    (at once for copies enqueued by the call that started the move; after the read for
///    moves from NVMe), then the stream waits for the event on the device;
///  * a move without one (it ends in file I/O): the caller's thread waits for the whole move.
class move_handle {
 public:
  move_handle() = default;
  explicit move_handle(std::shared_ptr<detail::move_state> state, std::shared_ptr<detail::device_mark> mark = nullptr)
      : state_(std::move(state)), mark_(std::move(mark)) {}

  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  /// True once the move has finished (successfully or not). Never blocks.
  [[nodiscard]] bool ready() const {
    if (!state_->is_done()) return false;
    if (mark_ == nullptr || !mark_->is_recorded() || error()) return true;
    return mark_->reached();
  }
  /// Blocks until the move finishes; rethrows its error (io_error, corruption_error, ...).
  void wait() const {
    wait_enqueued();
    if (mark_ != nullptr && mark_->is_recorded() && !mark_->reached()) mark_->device->synchronize_event(mark_->ev);
  }
  /// True once the move's host part is over: its file I/O is done and its device copy, if
  /// any, is enqueued (so stream_wait will not block). Never blocks.
  [[nodiscard]] bool enqueued() const { return state_->is_done(); }
  /// Blocks until enqueued(); rethrows the move's error. The device copy may still run.
  void wait_enqueued() const {
    state_->wait_done();
    if (auto e = error()) std::rethrow_exception(e);
  }
  /// The move's error once its host part is over, else null. A copy of the thread's error that
  /// only the caller holds (Note [Errors that cross threads]), so it outlives the handle safely.
  [[nodiscard]] std::exception_ptr error() const {
    std::lock_guard lock(state_->m);
    return detail::copy_error(state_->error);
  }
  /// Makes later work on stream `s` of `device` wait until the destination's bytes are there:
  /// a device-side event wait for moves with a device event on `device`, else a wait on the
  /// calling thread for the whole move (see the class comment). Never enqueues a host function.
  /// It does not report the move's error: check wait() or error() for that. Must not be called
  /// from stream work.
  void stream_wait(Device& device, stream s) const {
    if (mark_ != nullptr && mark_->device == &device) {
      if (mark_->wait_settled()) device.stream_wait_event(s, mark_->ev);
      return;
    }
    state_->wait_done();
  }
  /// True when the move has a device event (whether or not it is recorded yet).
  [[nodiscard]] bool has_device_event() const noexcept { return mark_ != nullptr; }
  /// The device event recorded after the move's device copy (it may not be recorded yet: see
  /// stream_wait), or a null event for moves without one. Valid while a handle of the move lives.
  [[nodiscard]] event device_event() const noexcept { return mark_ != nullptr ? mark_->ev : event{}; }

 private:
  std::shared_ptr<detail::move_state> state_;
  std::shared_ptr<detail::device_mark> mark_;
};

}  // namespace spillway
