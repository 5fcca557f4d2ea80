// Seams a Session exposes for tests and tools: ways to put something between the Session and
// the hardware without changing its config (e.g. a faulty I/O queue under the NVMe tier).
#pragma once

#include <functional>
#include <memory>

#include "device/device.hpp"
#include "prefetch/plan.hpp"
#include "prefetch/trace.hpp"
#include "swap/io_queue.hpp"

namespace spillway {

struct session_hooks {
  /// Makes each NVMe ring's I/O queue; empty means liburing (make_uring_queue).
  std::function<std::unique_ptr<io_queue>(unsigned depth)> make_io_queue;
  /// Takes the device the Session opened and returns the one it uses: a tool's decorator that
  /// forwards every call (to count or time them). Empty means the device as opened.
  std::function<std::unique_ptr<Device>(std::unique_ptr<Device>)> wrap_device;
  /// op_scope::run copies the op's tensors through pinned host memory, as on a GPU, on any
  /// backend (Note [Host runs] in session_host_run.cpp): tests of the GPU path.
  bool stage_host_runs = false;
  /// Changes each plan the Session makes, before the executor follows it (its layout is packed
  /// again for the changed plan): tests of plans no planner makes, such as a recomputation the
  /// planner would never schedule. The plan must still pass plan::validate for the trace.
  std::function<void(const trace&, plan&)> edit_plan;
};

}  // namespace spillway
