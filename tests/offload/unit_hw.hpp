// The hardware profile the simulator's hand-worked timelines use: 1 GFLOP/s of compute (an op
// of 1e9 flops takes 1 s), 1000 B/s each way over the link, 500 B/s to and from NVMe, memory
// that never limits, and a host that moves 1000 B/s on one core (a host op moving 1000 B takes
// 1 s); and the op of one second on it that those timelines are made of.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "offload/profile.hpp"
#include "prefetch/trace.hpp"

namespace spillway::offload::testing {

inline hw_profile unit_hw() {
  hw_profile hw;
  hw.name = "unit";
  hw.device_bytes = 1 << 20;
  hw.compute_flops_per_s = 1e9;
  hw.hbm_bytes_per_s = 1e18;
  hw.h2d_bytes_per_s = 1000;
  hw.d2h_bytes_per_s = 1000;
  hw.copy_engines = 2;
  hw.host_bytes = 1 << 20;
  hw.nvme_read_bytes_per_s = 500;
  hw.nvme_write_bytes_per_s = 500;
  hw.nvme_bytes = 1 << 20;
  hw.host_mem_bytes_per_s = 1000;
  hw.host_cores = 1;
  hw.host_vector_width = 1;
  hw.host_clock_hz = 1e9;
  return hw;
}

/// An op of 1e9 flops (one second on unit_hw) reading `r` and writing `w`.
inline op_desc op1s(std::string name, std::vector<tensor_id> r, std::vector<tensor_id> w, bool recomputable = false) {
  op_desc o;
  o.name = std::move(name);
  o.reads = std::move(r);
  o.writes = std::move(w);
  o.flops = 1e9;
  o.recomputable = recomputable;
  return o;
}

}  // namespace spillway::offload::testing
