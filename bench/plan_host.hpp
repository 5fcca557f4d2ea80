// spillway-bench plan, the host-placement runs: the ZeRO-Offload paper's 10B GPT on v100-32g
// and the search for the largest GPT each policy trains (PASS/MISS lines for issue 18's targets).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spillway::bench {

struct paper_args {
  std::uint32_t batch = 10, seq = 1024;
  std::vector<std::string> policies;
};
/// Plans and simulates the 10B shape (50 layers, hidden 4096, 32 heads, fp16) on v100-32g at
/// its whole device memory; prints one row per policy and the targets. Returns 0 when all pass.
int run_paper(const paper_args& a);

struct largest_args {
  std::vector<std::string> hw;
  std::uint32_t batch = 4, seq = 1024;
  std::string host_memory, nvme;  ///< overrides of the profile's tiers ("" keeps them)
  std::vector<std::string> policies;
};
/// For each profile and policy, the most layers L of a GPT with GPT-3's proportions (hidden
/// 128 L, heads of 128) whose plan is feasible at the whole device memory; prints them with
/// step time and TFLOPS, and the targets on v100-32g. Returns 0 when all pass.
int run_largest(const largest_args& a);

}  // namespace spillway::bench
