// move_handle: the result of an asynchronous move between tiers. Wait on it on the host, or
// make a device stream wait for it, so the executor can chain GPU copies and file I/O.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "device/device.hpp"

namespace spillway {

namespace detail {
/// Shared completion state of one move. finish() is called exactly once, from whichever
/// thread completes the move (an I/O thread or a stream thread).
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
};
}  // namespace detail

/// A handle to one move. Cheap to copy; all copies refer to the same move.
///
/// The move is finished when ready(): its destination holds the bytes (verified by CRC32C when
/// read from NVMe) and its source copy has been released, or it failed, the tensor is still
/// where it was, and error() says why (an io_error naming the tensor). Note [Waiting on a
/// device stream] in tensor_store.cpp says how stream_wait avoids blocking where it can.
class move_handle {
 public:
  move_handle() = default;
  explicit move_handle(std::shared_ptr<detail::move_state> state, Device* device = nullptr, event done = {})
      : state_(std::move(state)), device_(device), event_(done) {}

  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  /// True once the move has finished (successfully or not). Never blocks.
  [[nodiscard]] bool ready() const {
    std::lock_guard lock(state_->m);
    return state_->done;
  }
  /// Blocks until the move finishes; rethrows its error (io_error, corruption_error, ...).
  void wait() const {
    state_->wait_done();
    if (auto e = error()) std::rethrow_exception(e);
  }
  /// The move's error once ready(), else null.
  [[nodiscard]] std::exception_ptr error() const {
    std::lock_guard lock(state_->m);
    return state_->error;
  }
  /// Makes later work on stream `s` of `device` wait until the destination's bytes are there.
  /// For moves that end with a copy onto the device this is a device event wait (no host
  /// thread blocks); for moves that end in file I/O a host task on `s` waits for the I/O.
  /// It does not report the move's error: check wait() or error() for that.
  void stream_wait(Device& device, stream s) const {
    if (event_.handle != nullptr && device_ == &device) {
      device.stream_wait_event(s, event_);
      return;
    }
    device.launch_host(s, [st = state_] { st->wait_done(); });
  }
  /// The device event recorded after the move's last device copy, or a null event for moves
  /// that do not end on a device stream. Valid until the tensor's next move or removal.
  [[nodiscard]] event device_event() const noexcept { return event_; }

 private:
  std::shared_ptr<detail::move_state> state_;
  Device* device_ = nullptr;
  event event_{};
};

}  // namespace spillway
