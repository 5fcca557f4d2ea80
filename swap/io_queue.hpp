// The I/O seam: the one interface through which the NVMe tier issues reads and writes.
// uring_queue (liburing) implements it; tests wrap it to inject faults (EIO, short transfers, ...).
//
// Contract, in the shape of io_uring (see Note [I/O seam] in nvme_tier.cpp):
//  * submit() hands over up to depth() - in_flight operations; each later comes back exactly
//    once from reap() as {op, result}. The op is carried through the queue untouched (io_uring's
//    user_data), so the caller keeps its request state in it.
//  * result is the bytes transferred (possibly fewer than asked: a short transfer) or the
//    negated errno, as in an io_uring CQE's res. -EAGAIN means "try again".
//  * reap() waits up to timeout for the first completion, then collects what is already there
//    without waiting (wait then peek).
//  * Fixed buffers: after register_buffers(iov), an op with buffer_index >= 0 must lie inside
//    iov[buffer_index] (after update_buffer(i, b), inside b for index i). Registration may fail
//    (returns -errno); ops then use buffer_index -1.
//  * cancel(op) asks the queue to give up an op in flight (io_uring: IORING_OP_ASYNC_CANCEL). The
//    op still comes back from reap() exactly once: -ECANCELED when the cancel won, else its own
//    result whenever the kernel finishes it (a read already on the drive cannot be stopped), so
//    the caller keeps the op and its buffer until then (Note [Hung completions] in io_ring.cpp).
//  * A queue is used by one thread at a time (its ring's I/O thread).
#pragma once

#include <sys/uio.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "device/interface.hpp"

namespace spillway {

enum class io_kind : std::uint8_t { read, write };

/// One read or write: a descriptor the queue carries from submit() to reap().
struct io_op {
  io_kind kind = io_kind::read;
  int fd = -1;
  void* buffer = nullptr;
  std::uint32_t length = 0;
  std::uint64_t offset = 0;   ///< byte offset in the file
  int buffer_index = -1;      ///< registered buffer holding [buffer, buffer + length), or -1
};

/// What reap() returns for one op: bytes transferred, or -errno.
struct io_completion {
  io_op* op = nullptr;
  int result = 0;
};

class io_queue : public abstract_interface {
 public:
  /// Most operations in flight at once.
  [[nodiscard]] virtual unsigned depth() const noexcept = 0;
  /// Registers fixed buffers (replacing any registered before); 0 or -errno.
  virtual int register_buffers(std::span<const iovec> buffers) = 0;
  virtual void unregister_buffers() noexcept = 0;
  /// Registers an empty table of `slots` fixed buffers (replacing any registered before), to be
  /// filled one slot at a time with update_buffer, so that a new buffer costs one pin and not a
  /// re-registration of all; 0 or -errno (this default: -EOPNOTSUPP, use register_buffers).
  virtual int reserve_buffer_slots(unsigned slots) {
    (void)slots;
    return -EOPNOTSUPP;
  }
  /// Puts `buffer` in slot `index` of the table reserve_buffer_slots made; 0 or -errno.
  virtual int update_buffer(unsigned index, const iovec& buffer) {
    (void)index;
    (void)buffer;
    return -EOPNOTSUPP;
  }
  /// Starts `ops` (at most depth() minus those in flight), or a leading part of them, and
  /// returns how many it took: each of those comes back from reap() exactly once, the rest were
  /// not started (the caller fails them). Throws io_error, having taken none, when the kernel
  /// refuses the submission itself (not when an op fails: that comes back from reap()).
  virtual std::size_t submit(std::span<io_op* const> ops) = 0;
  /// Asks for `op` (in flight) to be cancelled; 0 when the request went out, or -errno. Whether
  /// it won shows in the op's completion, which reap() still returns once. This default cannot
  /// cancel: -EOPNOTSUPP (the op completes in its own time).
  virtual int cancel(io_op* op) {
    (void)op;
    return -EOPNOTSUPP;
  }
  /// Waits up to `timeout` for one completion, then collects those already done, up to
  /// out.size(). Returns how many were written to `out`.
  virtual std::size_t reap(std::span<io_completion> out, std::chrono::microseconds timeout) = 0;
};

/// An io_queue on a liburing ring of `depth` entries. Throws io_error when the kernel has no
/// io_uring (or it is forbidden, e.g. by a container's seccomp profile).
[[nodiscard]] std::unique_ptr<io_queue> make_uring_queue(unsigned depth);

}  // namespace spillway
