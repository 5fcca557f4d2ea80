// event_pool: events of one device, made once and reused, for code that needs an event per
// move or per free on the hot path.
#pragma once

#include <mutex>
#include <vector>

#include "device/device.hpp"

namespace spillway {

/// Events kept for reuse: on a GPU, making and destroying an event are a driver call each, and
/// the runtime needs one per move and per stream-ordered free. Whoever holds an event from the
/// pool holds the pool too (a shared_ptr), so it outlives them.
class event_pool {
 public:
  explicit event_pool(Device& d) : device_(&d) {}
  ~event_pool() {
    for (event e : free_) device_->destroy_event(e);
  }
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;

  [[nodiscard]] Device& device() const noexcept { return *device_; }
  [[nodiscard]] event take() {
    {
      std::lock_guard lock(m_);
      if (!free_.empty()) {
        const event e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    return device_->create_event();
  }
  /// Takes an event back. A wait enqueued on it earlier keeps the position it captured, and
  /// the event's next record starts a new one, so it may still be in flight.
  void give(event e) noexcept {
    std::lock_guard lock(m_);
    free_.push_back(e);
  }

 private:
  Device* device_;
  std::mutex m_;
  std::vector<event> free_;
};

}  // namespace spillway
