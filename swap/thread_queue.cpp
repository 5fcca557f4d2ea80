#include "swap/thread_queue.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "device/error.hpp"
#include "device/log.hpp"

namespace spillway {
namespace {

class thread_queue final : public io_queue {
 public:
  explicit thread_queue(unsigned depth) : depth_(depth) {
    if (depth == 0) throw config_error("nvme.queue_depth: 0 is not a queue depth; give at least 1");
    const unsigned threads = std::min(depth, 4u);
    for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { serve(); });
  }
  ~thread_queue() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  [[nodiscard]] unsigned depth() const noexcept override { return depth_; }
  int register_buffers(std::span<const iovec>) override { return -EOPNOTSUPP; }
  void unregister_buffers() noexcept override {}

  std::size_t submit(std::span<io_op* const> ops) override {
    {
      std::lock_guard lock(mutex_);
      SPILLWAY_EXPECTS_T(usage_error, in_flight_ + ops.size() <= depth_,
                         "thread queue: " + std::to_string(ops.size()) + " ops submitted with " +
                             std::to_string(in_flight_) + " of " + std::to_string(depth_) + " in flight");
      for (io_op* op : ops) pending_.push_back(op);
      in_flight_ += ops.size();
    }
    work_cv_.notify_all();
    return ops.size();
  }

  // An op no thread has taken yet comes back at once as -ECANCELED; a pread/pwrite already
  // running cannot be stopped (-EALREADY): it comes back when the system call returns, and the
  // ring keeps it abandoned until then (Note [Hung completions] in io_ring.cpp).
  int cancel(io_op* op) override {
    {
      std::lock_guard lock(mutex_);
      auto it = std::find(pending_.begin(), pending_.end(), op);
      if (it == pending_.end()) return -EALREADY;
      pending_.erase(it);
      done_.push_back({op, -ECANCELED});
    }
    done_cv_.notify_one();
    return 0;
  }

  std::size_t reap(std::span<io_completion> out, std::chrono::microseconds timeout) override {
    std::unique_lock lock(mutex_);
    done_cv_.wait_for(lock, timeout, [this] { return !done_.empty(); });
    std::size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    in_flight_ -= n;
    return n;
  }

 private:
  // One transfer, as an io_uring CQE would report it: bytes moved (maybe fewer: a short
  // transfer the caller continues) or -errno. EINTR is retried here, as the kernel would.
  static int transfer(const io_op& op) {
    for (;;) {
      const ssize_t r = op.kind == io_kind::read ? ::pread(op.fd, op.buffer, op.length, static_cast<off_t>(op.offset))
                                                 : ::pwrite(op.fd, op.buffer, op.length, static_cast<off_t>(op.offset));
      if (r >= 0) return static_cast<int>(r);
      if (errno != EINTR) return -errno;
    }
  }

  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      io_op* op = pending_.front();
      pending_.pop_front();
      lock.unlock();
      const int result = transfer(*op);
      lock.lock();
      done_.push_back({op, result});
      done_cv_.notify_one();
    }
  }

  const unsigned depth_;
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<io_op*> pending_;
  std::deque<io_completion> done_;
  std::size_t in_flight_ = 0;  // submitted and not yet reaped
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<io_queue> make_thread_queue(unsigned depth) { return std::make_unique<thread_queue>(depth); }

std::unique_ptr<io_queue> make_queue_or_threads(unsigned depth,
                                                const std::function<std::unique_ptr<io_queue>(unsigned)>& preferred,
                                                bool& preferred_works) {
  if (preferred_works) {
    try {
      return preferred(depth);
    } catch (const io_error& e) {
      preferred_works = false;
      log(log_level::warning, std::string("nvme tier: io_uring is not available (") + e.what() +
                                  "); reads and writes go through pread/pwrite threads instead, more slowly");
    }
  }
  return make_thread_queue(depth);
}

}  // namespace spillway
