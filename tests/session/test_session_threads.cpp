// A Session used by one thread at a time (Note [One thread at a time] in offload/session_call.hpp):
// a call from a second thread while the first is inside a call, or holds an op's scope open, is a
// usage_error that leaves the first thread's step whole; threads that take turns are fine.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "device/error.hpp"
#include "offload/swap_policy.hpp"
#include "loop_config.hpp"
#include "watchdog.hpp"

using namespace spillway;

namespace {

constexpr std::size_t words = 4096;

/// What a call from another thread threw (empty: it did not throw).
template <class F>
std::string from_another_thread(F f) {
  return std::async(std::launch::async, [&] {
           try {
             f();
           } catch (const usage_error& e) {
             return std::string(e.what());
           }
           return std::string();
         }).get();
}

/// A three-layer step with integer arithmetic; `inside_op` runs inside the first op's scope, and
/// `inside_run` inside its host body (op.run).
struct loop {
  explicit loop(Session& s) : s_(s) {
    std::vector<std::uint32_t> init(words);
    for (std::size_t i = 0; i < words; ++i) init[i] = static_cast<std::uint32_t>(i * 7 + 3);
    w_ = s.add_persistent("w", words * 4, tensor_kind::parameter, init.data());
    m_ = s.add_persistent("m", words * 4, tensor_kind::optimizer_state);
  }
  void step(int it, const std::function<void()>& inside_op = {}, const std::function<void()>& inside_run = {}) {
    s_.begin_iteration();
    auto a = s_.add_transient("a", words * 4);
    auto b = s_.add_transient("b", words * 4);
    {
      auto op = s_.op("fwd0", {w_}, {a});
      if (inside_op) inside_op();
      op.run([&](const Session::op_scope::host_access& h) {
        if (inside_run) inside_run();
        for (std::size_t i = 0; i < words; ++i) h.ptr<std::uint32_t>(a)[i] = h.ptr<std::uint32_t>(w_)[i] * 3 + it;
      });
    }
    {
      auto op = s_.op("fwd1", {a}, {b});
      op.run([&](const Session::op_scope::host_access& h) {
        for (std::size_t i = 0; i < words; ++i) h.ptr<std::uint32_t>(b)[i] = h.ptr<std::uint32_t>(a)[i] ^ 0x9e3779b9u;
      });
    }
    auto c = s_.add_transient("c", words * 4);
    {
      auto op = s_.op("fwd2", {b}, {c});
      op.run([&](const Session::op_scope::host_access& h) {
        for (std::size_t i = 0; i < words; ++i) h.ptr<std::uint32_t>(c)[i] = h.ptr<std::uint32_t>(b)[i] * 2654435761u;
      });
    }
    s_.release(b);
    {
      auto op = s_.op("grad", {c, m_}, {m_});
      op.run([&](const Session::op_scope::host_access& h) {
        for (std::size_t i = 0; i < words; ++i) h.ptr<std::uint32_t>(m_)[i] = h.ptr<std::uint32_t>(m_)[i] * 5 + h.ptr<std::uint32_t>(c)[i];
      });
    }
    s_.release(c);
    {
      auto op = s_.op("update", {a, w_, m_}, {w_, m_});
      op.run([&](const Session::op_scope::host_access& h) {
        for (std::size_t i = 0; i < words; ++i) h.ptr<std::uint32_t>(w_)[i] += (h.ptr<std::uint32_t>(a)[i] + h.ptr<std::uint32_t>(m_)[i]) >> 9;
      });
    }
    s_.release(a);
    (void)s_.end_iteration();
  }
  std::vector<std::uint32_t> values() {
    std::vector<std::uint32_t> v(2 * words);
    s_.read(w_, v.data(), words * 4);
    s_.read(m_, v.data() + words, words * 4);
    return v;
  }
  Session& s_;
  tensor_handle w_, m_;
};

std::vector<std::uint32_t> resident(int steps) {
  Session s(spillway::testing::config_for("none", 0));
  loop l(s);
  for (int it = 1; it <= steps; ++it) l.step(it);
  return l.values();
}

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

TEST(SessionThreads, ASecondThreadIsRefusedWhileTheFirstHoldsAnOpOrIsInACall) {
  const spillway::testing::watchdog dog("SessionThreads.ASecondThread...", std::chrono::seconds(120));
  const auto dir = std::filesystem::temp_directory_path() / ("spillway-threads-" + std::to_string(::getpid()));
  for (const char* policy : {"none", "lms", "auto"}) {
    SCOPED_TRACE(policy);
    Session s(spillway::testing::config_for(policy, 0.75));
    loop l(s);
    std::vector<std::uint32_t> host(words);
    int refused = 0;
    for (int it = 1; it <= 4; ++it) {
      // Inside the first op's scope, between its calls: every changing call from another thread
      // is refused, and the step goes on whole.
      auto in_scope = [&] {
        for (const auto& msg : {from_another_thread([&] { s.read(l.w_, host.data(), words * 4); }),
                                from_another_thread([&] { (void)s.add_transient("stray", 64); }),
                                from_another_thread([&] { (void)s.op("stray", {l.w_}, {}); }),
                                from_another_thread([&] { (void)s.end_iteration(); }),
                                from_another_thread([&] { s.save(dir.string()); })}) {
          EXPECT_TRUE(has(msg, "another thread holds an op's scope open")) << msg;
          EXPECT_TRUE(has(msg, "one thread at a time")) << msg;
          ++refused;
        }
        bool gave_up = true;
        from_another_thread([&] { gave_up = s.abandon_iteration(); });  // does nothing: the step is not its thread's
        EXPECT_FALSE(gave_up) << "abandon_iteration from another thread said it gave the step up";
      };
      // Inside op.run's body, a Session call in progress.
      auto in_run = [&] {
        const auto msg = from_another_thread([&] { s.set_device_budget(s.device_budget()); });
        EXPECT_TRUE(has(msg, "set_device_budget called while another thread is inside a Session call")) << msg;
        ++refused;
      };
      l.step(it, in_scope, in_run);
      EXPECT_TRUE(s.history().back().iteration == static_cast<std::uint64_t>(it)) << "the step did not end as the loop's own";
    }
    EXPECT_EQ(refused, 4 * 6);
    EXPECT_EQ(l.values(), resident(4)) << "the refused calls changed the step";
    EXPECT_TRUE(s.history().back().planned);
  }
  std::filesystem::remove_all(dir);
}

// Threads that take turns, each one's calls over before the next thread's begin: the loop moves
// from thread to thread (and a checkpoint is made on another thread between steps) as it would
// on one.
TEST(SessionThreads, ThreadsThatTakeTurnsRunTheLoopAsOneWould) {
  const spillway::testing::watchdog dog("SessionThreads.ThreadsThatTakeTurns...", std::chrono::seconds(120));
  const auto dir = std::filesystem::temp_directory_path() / ("spillway-turns-" + std::to_string(::getpid()));
  Session s(spillway::testing::config_for("auto", 0.75));
  loop l(s);
  for (int it = 1; it <= 6; ++it) {
    std::thread t([&] { l.step(it); });
    t.join();
    if (it == 3) std::thread([&] { s.save(dir.string(), "step 3"); }).join();
  }
  EXPECT_EQ(l.values(), resident(6));
  EXPECT_TRUE(s.history().back().planned);
  EXPECT_EQ(s.load(dir.string()), "step 3");
  EXPECT_EQ(l.values(), resident(3)) << "the checkpoint made on another thread";
  std::filesystem::remove_all(dir);
}

}  // namespace
