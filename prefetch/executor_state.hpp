// The executor's per-tensor state, shared by the files that implement it (executor.cpp,
// executor_recompute.cpp). Not installed: only the executor includes it.
#pragma once

#include <memory>

#include "prefetch/executor.hpp"

namespace spillway {

struct executor::tensor_state {
  tensor_desc desc;
  bool defined = false;
  void* dev = nullptr;
  bool dev_valid = false;      // device memory holds the current value
  bool tier_current = false;   // the backing's copy holds the current value
  bool released = false;       // transient whose life ended in this iteration
  std::unique_ptr<owned_event> ready;  // recorded on h2d after a load whose handle has no device event
  bool ready_pending = false;  // a load was enqueued and compute has not waited on it yet
  move_handle pending_load;
  move_handle pending_save;
  bool loaded_from_nvme = false;
  std::uint64_t last_used = 0;
  std::uint64_t version = 0;   // values it has held: counts writes by ops and uploads (Note [Rerun checks])
  bool awaiting_rerun = false; // its value was dropped for a recomputation that has not run yet
  bool rerun_temp = false;     // released, made again by a rerun: freed after the op, or after a later step reads it
};

struct executor::probe {
  std::vector<std::string> tensors;
  event start{};  // recorded on compute before the waits for the tensors, `end` after them
  event end{};
};

struct executor::stamp {
  timeline_item* item = nullptr;
  event at{};
  event origin{};      // the origin of the stream `at` was recorded on
  bool start = false;  // sets item->start_us, else item->end_us
};

}  // namespace spillway
