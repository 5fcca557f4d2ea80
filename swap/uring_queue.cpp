// io_queue on liburing: batched submission, wait-then-peek reaping, fixed buffers.
// The op pointer travels as the SQE's user_data; a CQE's res is the result as it stands.
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "device/error.hpp"
#include "swap/io_queue.hpp"

namespace spillway {
namespace {

class uring_queue final : public io_queue {
 public:
  explicit uring_queue(unsigned depth) : depth_(depth) {
    if (depth < 1 || depth > 4096)
      throw config_error("io_uring queue depth " + std::to_string(depth) + " (nvme_options.queue_depth): use 1 to 4096");
    // One thread submits and reaps (the ring's I/O thread), so completion work can wait until
    // it enters the kernel instead of interrupting it; older kernels get plain setup.
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE | IORING_SETUP_COOP_TASKRUN;
    params.cq_entries = 2 * depth;
    int rc = io_uring_queue_init_params(depth, &ring_, &params);
    if (rc == -EINVAL) {
      params = io_uring_params{};
      params.flags = IORING_SETUP_CQSIZE;
      params.cq_entries = 2 * depth;
      rc = io_uring_queue_init_params(depth, &ring_, &params);
    }
    if (rc < 0)
      throw io_error("io_uring setup failed (depth " + std::to_string(depth) + "): " + std::strerror(-rc), -rc);
  }
  ~uring_queue() override { io_uring_queue_exit(&ring_); }

  [[nodiscard]] unsigned depth() const noexcept override { return depth_; }

  int register_buffers(std::span<const iovec> buffers) override {
    unregister_buffers();
    if (buffers.empty()) return 0;
    const int rc = io_uring_register_buffers(&ring_, buffers.data(), static_cast<unsigned>(buffers.size()));
    registered_ = rc == 0;
    return rc;
  }

  int reserve_buffer_slots(unsigned slots) override {
    unregister_buffers();
    const int rc = io_uring_register_buffers_sparse(&ring_, slots);
    registered_ = rc == 0;
    return rc;
  }

  int update_buffer(unsigned index, const iovec& buffer) override {
    if (!registered_) return -EINVAL;
    __u64 tag = 0;
    const int rc = io_uring_register_buffers_update_tag(&ring_, index, &buffer, &tag, 1);
    return rc < 0 ? rc : 0;
  }

  void unregister_buffers() noexcept override {
    if (registered_) io_uring_unregister_buffers(&ring_);
    registered_ = false;
  }

  // Note [Ops in the ring are taken]
  // An op whose entry is in the submission ring goes to the kernel at the next io_uring_enter
  // that submits, whether or not this one's did: entries cannot be taken back. So once an op
  // has its entry it is taken (submit counts it, its completion will come), and a submission
  // the kernel refuses now (EAGAIN, EBUSY) is tried again at the next flush, which reap() makes
  // too. Only an op that found no entry is not taken.
  std::size_t submit(std::span<io_op* const> ops) override {
    std::size_t taken = 0;
    for (io_op* op : ops) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {  // the SQ is full: push what we have, then take a fresh entry
        const int rc = try_flush();
        sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) {
          if (taken > 0) return taken;
          throw io_error(std::string("io_uring: no submission entry free") + (rc < 0 ? std::string(": ") + std::strerror(-rc) : ""),
                         rc < 0 ? -rc : EBUSY);
        }
      }
      const bool fixed = op->buffer_index >= 0 && registered_;
      if (op->kind == io_kind::read) {
        if (fixed)
          io_uring_prep_read_fixed(sqe, op->fd, op->buffer, op->length, op->offset, op->buffer_index);
        else
          io_uring_prep_read(sqe, op->fd, op->buffer, op->length, op->offset);
      } else {
        if (fixed)
          io_uring_prep_write_fixed(sqe, op->fd, op->buffer, op->length, op->offset, op->buffer_index);
        else
          io_uring_prep_write(sqe, op->fd, op->buffer, op->length, op->offset);
      }
      io_uring_sqe_set_data(sqe, op);
      ++taken;
    }
    (void)try_flush();  // what the kernel refuses now goes at the next flush (Note [Ops in the ring are taken])
    return taken;
  }

  // The cancel request carries a tag of its own as user_data; its CQE (0, -ENOENT, -EALREADY)
  // is dropped by reap(): the cancelled op reports itself.
  int cancel(io_op* op) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      try {
        flush();
      } catch (const io_error& e) {
        return -e.error_number();
      }
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return -EBUSY;
    }
    io_uring_prep_cancel(sqe, op, 0);
    io_uring_sqe_set_data(sqe, &cancel_tag_);
    try {
      flush();
    } catch (const io_error& e) {
      return -e.error_number();
    }
    return 0;
  }

  std::size_t reap(std::span<io_completion> out, std::chrono::microseconds timeout) override {
    if (out.empty()) return 0;
    if (io_uring_sq_ready(&ring_) > 0) (void)try_flush();  // entries an earlier flush could not send
    io_uring_cqe* cqe = nullptr;
    int rc = 0;
    if (timeout.count() > 0) {
      __kernel_timespec ts{};
      ts.tv_sec = timeout.count() / 1000000;
      ts.tv_nsec = (timeout.count() % 1000000) * 1000;
      rc = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    } else {
      rc = io_uring_peek_cqe(&ring_, &cqe);
    }
    if (rc < 0 && rc != -ETIME && rc != -EAGAIN && rc != -EINTR)
      throw io_error(std::string("io_uring: waiting for completions failed: ") + std::strerror(-rc), -rc);
    std::size_t n = 0;
    while (n < out.size() && io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
      if (io_uring_cqe_get_data(cqe) == &cancel_tag_) {  // a cancel request's own answer
        io_uring_cqe_seen(&ring_, cqe);
        continue;
      }
      out[n].op = static_cast<io_op*>(io_uring_cqe_get_data(cqe));
      out[n].result = cqe->res;
      ++n;
      io_uring_cqe_seen(&ring_, cqe);
    }
    return n;
  }

 private:
  void flush() {
    if (const int rc = try_flush(); rc < 0) throw io_error(std::string("io_uring: submit failed: ") + std::strerror(-rc), -rc);
  }
  // Sends the entries in the submission ring; 0, or the -errno of a refusal that retrying did
  // not get past (the entries then stay in the ring for the next flush).
  int try_flush() noexcept {
    for (int tries = 0; io_uring_sq_ready(&ring_) > 0; ++tries) {
      const int rc = io_uring_submit(&ring_);
      if (rc >= 0) continue;
      if ((rc == -EAGAIN || rc == -EINTR || rc == -EBUSY) && tries < 1000) continue;
      return rc;
    }
    return 0;
  }

  io_uring ring_{};
  unsigned depth_;
  bool registered_ = false;
  char cancel_tag_ = 0;  // its address marks cancel requests' CQEs
};

}  // namespace

std::unique_ptr<io_queue> make_uring_queue(unsigned depth) { return std::make_unique<uring_queue>(depth); }

}  // namespace spillway
