// Seams a Session exposes for tests and tools: ways to put something between the Session and
// the hardware without changing its config (e.g. a faulty I/O queue under the NVMe tier).
#pragma once

#include <functional>
#include <memory>

#include "swap/io_queue.hpp"

namespace spillway {

struct session_hooks {
  /// Makes each NVMe ring's I/O queue; empty means liburing (make_uring_queue).
  std::function<std::unique_ptr<io_queue>(unsigned depth)> make_io_queue;
};

}  // namespace spillway
