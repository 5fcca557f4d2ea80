// An io_queue without io_uring: reads and writes done with pread/pwrite by a few threads. For
// where io_uring is refused (containers' default seccomp profiles, some sandboxes, kernels built
// without it); the NVMe tier falls back to it when make_uring_queue cannot make a ring. Same
// contract as every io_queue (swap/io_queue.hpp); it has no fixed buffers, so
// register_buffers answers -EOPNOTSUPP and every op goes with buffer_index -1.
#pragma once

#include <functional>
#include <memory>

#include "swap/io_queue.hpp"

namespace spillway {

/// A queue of `depth` operations in flight, served by min(depth, 4) threads.
[[nodiscard]] std::unique_ptr<io_queue> make_thread_queue(unsigned depth);

/// `preferred(depth)` (make_uring_queue for the NVMe tier) unless it throws io_error (the kernel
/// refused io_uring), or `preferred_works` is already false: then a thread queue, with a
/// warning to the log the first time, and `preferred_works` set to false.
[[nodiscard]] std::unique_ptr<io_queue> make_queue_or_threads(
    unsigned depth, const std::function<std::unique_ptr<io_queue>(unsigned)>& preferred, bool& preferred_works);

}  // namespace spillway
