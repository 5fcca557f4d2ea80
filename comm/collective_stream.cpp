// collective_stream: a thread that runs collectives in order, each after its device event.
#include "comm/collective_stream.hpp"

#include <utility>

#include "device/error.hpp"

namespace spillway::comm {

collective_stream::collective_stream(Device& device) : device_(&device), events_(device) {
  thread_ = std::thread([this] { run(); });
}

collective_stream::~collective_stream() {
  {
    std::lock_guard lock(m_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (const job& j : jobs_) events_.give(j.ready);  // dropped after a failure
}

collective_stream::ticket collective_stream::enqueue(stream after, std::function<void()> work) {
  SPILLWAY_EXPECTS_T(usage_error, static_cast<bool>(work), "collective_stream::enqueue: the job is empty");
  {
    std::lock_guard lock(m_);
    if (error_) std::rethrow_exception(error_);
  }
  const event ready = events_.take();
  try {
    device_->record_event(ready, after);
  } catch (...) {
    events_.give(ready);
    throw;
  }
  ticket t = 0;
  {
    std::lock_guard lock(m_);
    jobs_.push_back({ready, std::move(work)});
    t = ++queued_;
  }
  cv_.notify_all();
  return t;
}

void collective_stream::wait(ticket t) {
  std::unique_lock lock(m_);
  SPILLWAY_EXPECTS_T(usage_error, t <= queued_,
                     "collective_stream::wait: ticket " + std::to_string(t) + " was never given (" +
                         std::to_string(queued_) + " jobs queued)");
  cv_.wait(lock, [&] { return done_ >= t || error_ != nullptr; });
  if (error_) std::rethrow_exception(error_);
}

void collective_stream::wait_all() {
  ticket last = 0;
  {
    std::lock_guard lock(m_);
    last = queued_;
  }
  wait(last);
}

std::uint64_t collective_stream::queued() const {
  std::lock_guard lock(m_);
  return queued_;
}

std::uint64_t collective_stream::done() const {
  std::lock_guard lock(m_);
  return done_;
}

void collective_stream::run() {
  bool made_current = false;
  for (;;) {
    job j;
    {
      std::unique_lock lock(m_);
      cv_.wait(lock, [&] { return stopping_ || (!jobs_.empty() && !error_); });
      if (jobs_.empty() || error_) return;  // stopping, and nothing (more) to run
      j = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::exception_ptr failure;
    try {
      if (!made_current) {
        device_->make_current();
        made_current = true;
      }
      device_->synchronize_event(j.ready);
      j.work();
    } catch (...) {
      failure = std::current_exception();
    }
    events_.give(j.ready);
    {
      std::lock_guard lock(m_);
      if (failure)
        error_ = std::move(failure);  // Note [Errors that cross threads]
      else
        ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace spillway::comm
