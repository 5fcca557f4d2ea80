// The executor's clock: timing events on the streams, read after the iteration's work is done
// (Note [Timing events]), for op durations, copy spans and stall probes.
#include <chrono>

#include "prefetch/executor.hpp"
#include "prefetch/executor_state.hpp"

namespace spillway {

// Note [Timing events]
// Op durations, copy spans and stall probes are measured with timing events recorded on the
// streams, read once the iteration's work is done (end_iteration), never with host functions:
// on a GPU each host function is a round trip to the driver that stops kernels from running
// back to back, which would inflate the very durations the planner is fed. Times are put on
// the executor's clock (microseconds since it was made) through origin events recorded on each
// of the three streams at begin_iteration, at a host time taken just before; the streams are
// idle then (the last iteration ended with a synchronize). Each stamp is read against the
// origin of its own stream: an idle stream may reach its origin a little late (a worker that
// has to wake, on the cpu backend), and so reaches everything after it later by the same
// amount, while another stream's origin says nothing of that. Events come from a pool that
// every iteration reuses.

double executor::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

event executor::timing_event() {
  if (timing_used_ == timing_events_.size()) timing_events_.emplace_back(*device_, /*timing=*/true);
  return timing_events_[timing_used_++].get();
}

event executor::origin_of(stream s) const noexcept {
  if (s == h2d_.get()) return origin_h2d_;
  if (s == d2h_.get()) return origin_d2h_;
  return origin_event_;
}

event executor::mark_time(stream s) {
  const event e = timing_event();
  device_->record_event(e, s);
  return e;
}

timeline_item* executor::stamp_start(stream s, timeline_item::track track, const std::string& name) {
  const event at = mark_time(s);  // first: a time the device refuses leaves no item behind
  timeline_.push_back(timeline_item{track, name, -1, -1});
  timeline_item* item = &timeline_.back();  // deque: the address stays valid as items are added
  stamps_.push_back(stamp{item, at, origin_of(s), true});
  return item;
}

void executor::stamp_end(stream s, timeline_item* item) {
  if (item == nullptr) return;
  stamps_.push_back(stamp{item, mark_time(s), origin_of(s), false});
}

void executor::read_stamps() {
  for (const auto& st : stamps_) {
    const double us = origin_us_ + device_->elapsed_ms(st.origin, st.at) * 1000.0;
    (st.start ? st.item->start_us : st.item->end_us) = us;
  }
  stamps_.clear();
}

}  // namespace spillway
