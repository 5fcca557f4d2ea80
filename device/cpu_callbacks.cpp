// The cpu backend's callback thread: where the host functions of every stream run, one at a
// time, as CUDA runs them. See Note [Host functions].
#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "device/cpu_device.hpp"
#include "device/cpu_device_detail.hpp"
#include "device/error.hpp"
#include "device/stream_work.hpp"
#include "device/units.hpp"

namespace spillway {

// Note [Host functions]
// CUDA runs a stream's host functions (cudaLaunchHostFunc) when the stream reaches them, and
// may run those of every stream on one driver thread, in an order it does not define. A host
// function that waits for other work can therefore wait for a host function queued behind
// itself: a hang that no GPU error reports. The cpu backend makes that the normal case: a
// stream's worker hands each host function to the one callback thread and waits for it; the
// callback thread runs one at a time, picking among those ready by a seeded random draw, so a
// test sees orders a GPU may choose. A host function that holds the callback thread past
// strict_rules::host_function_limit while one of another stream waits is reported as an error
// naming both streams; the device is then *wedged*: the error is sticky, waits on the device
// return, and the blocked host function's thread is left behind when the device goes.

void cpu_device::serve_callbacks() {
  std::unique_lock lock(callbacks_mutex_);
  for (;;) {
    callbacks_work_.wait(lock, [&] { return callbacks_stopping_ || !ready_calls_.empty(); });
    if (ready_calls_.empty()) return;
    auto it = ready_calls_.begin();
    if (ready_calls_.size() > 1) std::advance(it, static_cast<std::ptrdiff_t>(callback_order_() % ready_calls_.size()));
    auto call = std::move(it->second);
    ready_calls_.erase(it);
    call->started = true;
    running_call_ = call;
    running_since_ = std::chrono::steady_clock::now();
    lock.unlock();
    std::exception_ptr failure;
    {
      detail::stream_work_scope scope("a host function");
      // Its stream's worker holds the arena open already; this scope keeps it open for a host
      // function that outlives its worker's wait (a wedged device). Note [Debug host access].
      detail::guarded_arena::access access(arena_.get());
      try {
        call->fn();
      } catch (...) {
        failure = std::current_exception();
      }
      call->fn = nullptr;
    }
    host_functions_.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
    call->error = std::move(failure);  // Note [Errors that cross threads]
    call->done = true;
    running_call_.reset();
    callbacks_done_.notify_all();
  }
}

void cpu_device::run_host_function(stream_impl& q, std::function<void()> fn) {
  if (!rules_.one_callback_thread) {
    {
      detail::stream_work_scope scope("a host function");
      const struct release {
        std::function<void()>& fn;
        ~release() { fn = nullptr; }  // the captures die inside the scope, as on CUDA
      } release_after{fn};
      fn();
    }
    host_functions_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto call = std::make_shared<host_call>();
  call->fn = std::move(fn);
  call->from = &q;
  std::unique_lock lock(callbacks_mutex_);
  ready_calls_.emplace(q.number, call);
  callbacks_work_.notify_one();
  const auto limit = rules_.host_function_limit;
  const auto poll = limit.count() == 0 ? std::chrono::milliseconds(100)
                                       : std::min<std::chrono::milliseconds>(limit, std::chrono::milliseconds(50));
  auto unqueue = [&] { ready_calls_.erase(q.number); };
  while (!call->done) {
    callbacks_done_.wait_for(lock, poll);
    if (call->done) break;
    if (call->started) {
      // The host function that wedged the device: its stream moves on (so that the device can
      // be destroyed) while the function itself stays on the callback thread.
      SPILLWAY_EXPECTS_T(usage_error, !wedged_, "cpu device: a host function on " + q.label + " does not return");
      continue;
    }
    if (wedged_) {
      unqueue();
      SPILLWAY_EXPECTS_T(usage_error, false,
                         "cpu device: a host function on " + q.label +
                             " was not run: the callback thread is held by a host function that does not return");
    }
    if (limit.count() == 0 || running_call_ == nullptr || running_call_->from == &q) continue;
    const auto held = std::chrono::steady_clock::now() - running_since_;
    if (held < limit) continue;
    const std::string secs = format_number(std::chrono::duration<double>(held).count(), std::chars_format::fixed, 1) + " s";
    unqueue();
    // A misuse by the program's host function: usage_error, in the location format of the checks.
    auto wedge = std::make_exception_ptr(usage_error(
        "cpu device: a host function on " + running_call_->from->label + " held the callback thread for " + secs +
        " while a host function of " + q.label +
        " waited behind it. Host functions of all streams share one thread (as in CUDA), so a host function must "
        "never wait for other work; wait with an event on a stream (stream_wait_event), or on a host thread" +
        detail::location_suffix(__FILE__, __LINE__)));
    {
      std::lock_guard f(failure_mutex_);
      sticky_ = wedge;  // the device cannot go on: this error is the one every later call reports
    }
    wedged_ = true;
    std::rethrow_exception(wedge);
  }
  if (call->error) std::rethrow_exception(call->error);
}

}  // namespace spillway
