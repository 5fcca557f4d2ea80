// spillway-bench plan --ranks N: data parallel with ZeRO on a simulated network (issue 19's
// simulator target): each rank's step, the one-rank step and the scaling efficiency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "prefetch/trace.hpp"

namespace spillway::bench {

struct ranks_args {
  std::string name;                    ///< the model or trace file, for the rows
  std::vector<std::string> hw;         ///< profiles (default h200)
  std::uint32_t ranks = 0;             ///< 0: not given (plan one process)
  std::uint32_t ranks_per_node = 1;    ///< ranks sharing one host: its CPU, memory and NVMe split among them
  std::vector<std::string> budgets;
  std::vector<double> ratios;          ///< of the one-rank trace's peak live bytes (default 1/4)
  std::vector<std::string> policies;   ///< default: auto, zero-offload, lms, checkpoint
  std::string network;                 ///< "400Gb/s", "50GB/s", "unlimited"; "" keeps the profile's
  double network_latency_us = -1;      ///< < 0 keeps the profile's
  int zero = 2;                        ///< ZeRO stage 1 or 2
  std::string bucket = "200MB";
  std::string gather = "before_use";   ///< before_use or after_step
  std::uint32_t gather_ahead = 2;
  std::uint32_t early_step_lag = 8;
  std::vector<double> link_shares;     ///< Note [Planning with the network]; empty: the library's
  std::vector<double> early_step_shares;  ///< tried (Note [Data parallel]); empty: 0, 1/4, 1/2, 3/4, 1
  std::string chrome_file;             ///< the fastest rank plan's timeline ("" for none)
  std::uint64_t tokens = 0;            ///< tokens (images) in one rank's batch, for the output (0: not a zoo model)
  double model_flops = 0;              ///< 6 x parameters x tokens of one rank's batch (0: unknown)
};

/// Plans and simulates `t` (one rank's micro-batch) on one rank and on `ranks` ranks with each
/// policy at each budget and profile; prints the rows, the prediction and the target line.
/// Returns 0 when the target passes (or none applies and every row is feasible).
int run_ranks(const ranks_args& a, const trace& t);

/// "400Gb/s", "50GB/s", "100Mb/s", "12.5MB/s" in bytes per second; "unlimited" is infinity.
/// config_error naming `where` otherwise.
double parse_network_rate(const std::string& text, const std::string& where);

}  // namespace spillway::bench
