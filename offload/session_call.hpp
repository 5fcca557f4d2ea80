// A Session call's claim on the Session: the check that a Session is used by one thread at a time.
#pragma once

#include <string_view>

namespace spillway {
class session_impl;
}

namespace spillway::session_detail {

// Note [One thread at a time]
// A Session is used by one thread at a time: its calls change the iteration, the trace, the
// tiers and the executor, none of which is locked. Each call that changes them claims the
// Session for its thread while it runs (session_impl::caller), and an op's scope holds it for
// the thread that opened it from the op's start to the scope's end, as its kernels use the
// op's tensors (session_impl::op_thread). A call from another thread meanwhile (a checkpoint
// thread's save() during a step, a logger's read()) is a usage_error that says so, instead of
// a race that loses data. The thread that holds the claim may call in again (a rerun's body,
// an op's body under recomputable_op). Threads that take turns, each call over before another
// thread's begins (a lock around each call and op scope, or a join), are fine. Accessors that
// only look (history(), device_budget(), an op's ptr() and stream()) claim nothing.
class session_call {
 public:
  enum class mode {
    refuse,    // another thread's claim is a usage_error naming `call` (and `name`, its argument)
    wait,      // wait for the turn: the end of an op's scope, which others can only briefly hold
    try_only,  // take it if free, else do nothing (entered() is false): abandon_iteration, noexcept
  };
  session_call(session_impl& s, std::string_view call, std::string_view name = {}, mode m = mode::refuse);
  ~session_call();
  session_call(const session_call&) = delete;
  session_call& operator=(const session_call&) = delete;

  [[nodiscard]] bool entered() const noexcept { return entered_; }

 private:
  session_impl& s_;
  bool outer_ = false;    // this call took the claim (not a call from inside one on its thread)
  bool entered_ = false;
};

}  // namespace spillway::session_detail
