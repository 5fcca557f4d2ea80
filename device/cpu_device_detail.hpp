// The cpu backend's private types: what a stream, an event and a host function on the callback
// thread are made of. Only the cpu backend's own sources include this.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <algorithm>

#include "device/cpu_device.hpp"

namespace spillway {

struct cpu_device::event_impl {
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t recorded = 0;
  std::vector<std::uint64_t> outstanding;  // generations recorded and not yet reached, oldest first
  bool timing = false;
  std::chrono::steady_clock::time_point completed_at{};  // timing events: when the latest generation was reached

  /// Generation g (1-based) has been reached.
  [[nodiscard]] bool reached(std::uint64_t g) const {
    return g <= recorded && std::find(outstanding.begin(), outstanding.end(), g) == outstanding.end();
  }
};

struct cpu_device::stream_impl {
  std::mutex m;
  std::condition_variable work;     // signals new work (or stopping) to the stream's thread
  std::condition_variable drained;  // signals pending reaching 0 to synchronize_stream
  std::deque<work_item> queue;
  std::size_t pending = 0;          // enqueued and not yet finished
  bool stopping = false;
  std::exception_ptr error;         // first failure of stream work when errors are not sticky
  std::chrono::nanoseconds delay{0};
  stream_priority priority = stream_priority::normal;
  int number = 0;                   // 1, 2, ... in order of creation
  std::string label;                // "stream 3 (high priority)", for error messages
  std::thread worker;
};

/// One host function handed from its stream's worker to the callback thread.
struct cpu_device::host_call {
  std::function<void()> fn;
  const stream_impl* from = nullptr;
  bool started = false;  // under callbacks_mutex_
  bool done = false;     // under callbacks_mutex_
  std::exception_ptr error;
};

}  // namespace spillway
