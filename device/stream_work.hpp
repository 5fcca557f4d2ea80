// Which stream work the current thread is running, if any: host functions and cpu kernels must
// not call the Device (CUDA refuses API calls from host functions, and a kernel has no host
// API), so both backends mark the threads that run them and check the mark on every call.
#pragma once

namespace spillway::detail {

/// Names the stream work this thread runs now ("a host function", "a cpu kernel"), else null.
inline const char*& stream_work_context() noexcept {
  thread_local const char* context = nullptr;
  return context;
}

/// Marks the current thread as running stream work for its lifetime.
class stream_work_scope {
 public:
  explicit stream_work_scope(const char* what) noexcept : previous_(stream_work_context()) {
    stream_work_context() = what;
  }
  ~stream_work_scope() { stream_work_context() = previous_; }
  stream_work_scope(const stream_work_scope&) = delete;
  stream_work_scope& operator=(const stream_work_scope&) = delete;

 private:
  const char* previous_;
};

}  // namespace spillway::detail
