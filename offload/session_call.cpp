// Note [One thread at a time] in session_call.hpp.
#include "offload/session_call.hpp"

#include <string>
#include <thread>

#include "offload/session_impl.hpp"

namespace spillway::session_detail {

namespace {
[[noreturn]] void refuse(std::string_view call, std::string_view name, const char* why) {
  std::string what(call);
  if (!name.empty()) what += "(\"" + std::string(name) + "\")";
  throw usage_error("Session: " + what + " called while another thread " + why +
                    "; a Session is used by one thread at a time: make its calls from one thread, or hold one "
                    "lock across each call and op scope (Note [One thread at a time])");
}
}  // namespace

session_call::session_call(session_impl& s, std::string_view call, std::string_view name, mode m) : s_(s) {
  const std::thread::id me = std::this_thread::get_id();
  for (;;) {
    std::thread::id holder{};
    if (s.caller.compare_exchange_strong(holder, me, std::memory_order_acquire)) {
      outer_ = true;
      break;
    }
    if (holder == me) break;  // a call from inside a call on this thread
    if (m == mode::try_only) return;
    if (m == mode::refuse) refuse(call, name, "is inside a Session call");
    std::this_thread::yield();
  }
  // The claim is ours: the op state below is written only under it.
  if (m != mode::wait && s.op_open && s.op_thread != me) {
    if (outer_) s.caller.store(std::thread::id{}, std::memory_order_release);
    outer_ = false;
    if (m == mode::try_only) return;
    refuse(call, name, "holds an op's scope open");
  }
  entered_ = true;
}

session_call::~session_call() {
  if (outer_) s_.caller.store(std::thread::id{}, std::memory_order_release);
}

}  // namespace spillway::session_detail
