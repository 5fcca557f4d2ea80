// Helpers shared by the swap tests: temporary swap directories that clean up after
// themselves, random bytes, whether this process may pin fixed buffers, and a fault-injecting
// io_queue wrapped around the real one.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "swap/io_queue.hpp"
#include "swap/thread_queue.hpp"

namespace spillway::test {

/// A fresh directory under /tmp (a disk file system here, so O_DIRECT works), removed with
/// everything in it when the object goes.
class temp_dir {
 public:
  explicit temp_dir(const std::string& base = "/tmp") {
    std::string tmpl = base + "/spillway-swap-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed in " + base);
    path_ = buf.data();
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] bool empty() const { return std::filesystem::is_empty(path_); }

 private:
  std::string path_;
};

/// Why this process cannot register `bytes` of fixed buffers with io_uring: the kernel counts
/// them against the locked-memory limit (RLIMIT_MEMLOCK) of a process without CAP_IPC_LOCK (a
/// user's shell, not root). Empty when it can; the tests about registration itself skip then.
inline std::string cannot_pin(std::uint64_t bytes) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("CapEff:", 0) == 0 && ((std::stoull(line.substr(7), nullptr, 16) >> 14) & 1) != 0)
      return {};  // CAP_IPC_LOCK: no limit applies
  rlimit lim{};
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= bytes) return {};
  return "this process may lock " + std::to_string(lim.rlim_cur >> 10) +
         " KiB (RLIMIT_MEMLOCK, without CAP_IPC_LOCK), less than the " + std::to_string(bytes >> 10) +
         " KiB of fixed buffers the test registers; raise it with ulimit -l to run it";
}

inline std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<unsigned char> v(n);
  std::mt19937_64 rng(seed);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<unsigned char>(rng());
  return v;
}

/// What to do to the k-th op (counted from 1, per kind, over every queue sharing the plan).
struct fault_plan {
  /// hold: the op is done, but its completion is held back (a lost completion) until
  /// release_held is set or the queue goes. short_then_fail: a short transfer, and the op's
  /// continuation then fails with `error` (a disk filling up mid-block).
  enum class action { none, fail, short_transfer, zero_transfer, eagain, eintr, corrupt_on_disk, hold, short_then_fail };
  io_kind kind = io_kind::write;
  std::atomic<action> what{action::none};  ///< atomic: disarm() may come while I/O is in flight
  int error = EIO;              ///< for fail: the errno reported
  std::uint64_t first = 1;      ///< first op (1-based) of that kind to hit
  std::uint64_t count = 1;      ///< how many consecutive ops to hit (0 = all from first on)
  std::atomic<std::uint64_t> reads{0};
  std::atomic<std::uint64_t> writes{0};
  std::atomic<std::uint64_t> hits{0};
  int only_fd = -1;                        ///< when >= 0, only ops on this file count
  std::atomic<bool> release_held{false};   ///< hand back the held completions
  std::atomic<std::uint64_t> cancels{0};   ///< COUNT of cancel() calls seen
  std::atomic<std::uint64_t> held{0};      ///< COUNT of completions held now

  bool hit(io_kind k, int fd = -1) {
    if (what == action::none || k != kind) return false;
    if (only_fd >= 0 && fd != only_fd) return false;
    const std::uint64_t n = (k == io_kind::read ? reads : writes).fetch_add(1) + 1;
    const bool h = n >= first && (count == 0 || n < first + count);
    if (h) hits.fetch_add(1);
    return h;
  }
  void disarm() { what = action::none; }
};

/// The I/O seam as a test sees it: passes every op to the real queue and changes what comes
/// back, as a failing drive or a busy kernel would.
class fault_queue final : public io_queue {
 public:
  fault_queue(std::unique_ptr<io_queue> inner, std::shared_ptr<fault_plan> plan)
      : inner_(std::move(inner)), plan_(std::move(plan)) {}

  [[nodiscard]] unsigned depth() const noexcept override { return inner_->depth(); }
  int register_buffers(std::span<const iovec> b) override { return inner_->register_buffers(b); }
  void unregister_buffers() noexcept override { inner_->unregister_buffers(); }
  std::size_t submit(std::span<io_op* const> ops) override { return inner_->submit(ops); }
  int cancel(io_op* op) override {
    plan_->cancels.fetch_add(1);
    return inner_->cancel(op);  // the op is done inside: a held completion stays held
  }
  ~fault_queue() override { plan_->held.fetch_sub(held_.size()); }

  std::size_t reap(std::span<io_completion> out, std::chrono::microseconds timeout) override {
    if (plan_->release_held && !held_.empty()) {
      std::size_t n = 0;
      while (n < out.size() && !held_.empty()) {
        out[n++] = held_.back();
        held_.pop_back();
        plan_->held.fetch_sub(1);
      }
      return n;
    }
    const std::size_t got = inner_->reap(out, timeout);
    std::size_t n = 0;
    for (std::size_t i = 0; i < got; ++i) {
      io_completion c = out[i];
      if (alter(c)) out[n++] = c;
    }
    return n;
  }

 private:
  // False when the completion is held back.
  bool alter(io_completion& c) {
    if (c.result < 0) return true;
    if (auto it = continuing_.find(c.op); it != continuing_.end()) {  // the rest of a short_then_fail op
      continuing_.erase(it);
      c.result = -plan_->error;
      return true;
    }
    if (!plan_->hit(c.op->kind, c.op->fd)) return true;
    switch (plan_->what) {
      case fault_plan::action::hold:
        held_.push_back(c);
        plan_->held.fetch_add(1);
        return false;
      case fault_plan::action::short_then_fail: {
        const int half = (c.result / 2) / 4096 * 4096;
        if (half > 0) {
          c.result = half;
          continuing_.insert(c.op);
        } else {
          c.result = -plan_->error;
        }
        break;
      }
      case fault_plan::action::fail:
        c.result = -plan_->error;
        break;
      case fault_plan::action::eagain:
        c.result = -EAGAIN;
        break;
      case fault_plan::action::eintr:  // a completion interrupted by a signal
        c.result = -EINTR;
        break;
      case fault_plan::action::zero_transfer:  // no progress: a stuck write, or a read past the end
        c.result = 0;
        break;
      case fault_plan::action::short_transfer: {
        // Claim fewer bytes than were moved (aligned, so an O_DIRECT continuation is legal).
        const int half = (c.result / 2) / 4096 * 4096;
        if (half > 0) c.result = half;
        break;
      }
      case fault_plan::action::corrupt_on_disk:
        if (c.op->kind == io_kind::write) corrupt(*c.op);
        break;
      case fault_plan::action::none:
        break;
    }
    return true;
  }
  // Flips one byte of the block just written, on disk, through an aligned read-modify-write.
  static void corrupt(const io_op& op) {
    void* buf = std::aligned_alloc(4096, op.length);
    if (buf == nullptr) return;
    if (::pread(op.fd, buf, op.length, static_cast<off_t>(op.offset)) == static_cast<ssize_t>(op.length)) {
      static_cast<unsigned char*>(buf)[op.length / 3] ^= 0x5A;
      (void)!::pwrite(op.fd, buf, op.length, static_cast<off_t>(op.offset));
    }
    std::free(buf);
  }

  std::unique_ptr<io_queue> inner_;
  std::shared_ptr<fault_plan> plan_;
  std::vector<io_completion> held_;
  std::set<io_op*> continuing_;
};

/// A make_queue for nvme_options that wraps every ring's queue with `plan`.
inline auto faulty(std::shared_ptr<fault_plan> plan) {
  return [plan](unsigned depth) -> std::unique_ptr<io_queue> {
    return std::make_unique<fault_queue>(make_uring_queue(depth), plan);
  };
}

/// The same over the pread/pwrite thread queue the tier falls back to without io_uring.
inline auto faulty_threads(std::shared_ptr<fault_plan> plan) {
  return [plan](unsigned depth) -> std::unique_ptr<io_queue> {
    return std::make_unique<fault_queue>(make_thread_queue(depth), plan);
  };
}

}  // namespace spillway::test
