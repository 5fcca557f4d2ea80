// A watchdog for tests that could hang: if not disarmed within its time, it reports which test
// ran too long and ends the process with a failure instead of letting CI wait forever.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace spillway::testing {

class watchdog {
 public:
  watchdog(std::string what, std::chrono::seconds limit) : what_(std::move(what)) {
    thread_ = std::thread([this, limit] {
      std::unique_lock lock(m_);
      if (!cv_.wait_for(lock, limit, [this] { return disarmed_; })) {
        std::fprintf(stderr, "watchdog: %s did not finish within %lld s; failing instead of hanging\n",
                     what_.c_str(), static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  ~watchdog() {
    {
      std::lock_guard lock(m_);
      disarmed_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;

 private:
  std::string what_;
  std::mutex m_;
  std::condition_variable cv_;
  bool disarmed_ = false;
  std::thread thread_;
};

}  // namespace spillway::testing
