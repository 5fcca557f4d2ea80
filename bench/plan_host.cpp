// spillway-bench plan --zero-offload-paper and --largest: issue 18's targets for host placement.
#include "bench/plan_host.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "offload/simulator.hpp"
#include "offload/zoo.hpp"

namespace spillway::bench {

namespace {
using namespace spillway::offload;

struct outcome {
  bool feasible = false;
  double step_seconds = 0, model_tflops = 0, hardware_tflops = 0, host_ms = 0, plan_s = 0;
  std::uint64_t parameters = 0, peak_device = 0, peak_host = 0, peak_nvme = 0;
  std::size_t host_ops = 0, recomputes = 0;
};

// Plans and simulates one zoo trace at the whole device memory.
outcome plan_once(const std::string& policy, const zoo_options& zo, const hw_profile& hw) {
  outcome o;
  const auto t = make_model_trace("gpt3-13b", zo);
  const auto rep = analyze(t);
  const auto size = zoo_size("gpt3-13b", zo, t);
  o.parameters = size.parameters;
  if (rep.min_budget_bytes > hw.device_bytes) return o;
  const auto t0 = std::chrono::steady_clock::now();
  const plan p = make_planner(policy)->make_plan(t, rep, hw, hw.device_bytes);
  o.plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto s = simulate(t, rep, p, hw);
  o.feasible = s.feasible();
  o.step_seconds = s.step_seconds;
  double flops = 0;
  for (const auto& op : t.ops) flops += op.flops;
  for (const auto& st : p.steps)
    for (op_index k : st.recomputes) flops += t.ops[k].flops;
  o.model_tflops = 6.0 * static_cast<double>(size.parameters) * static_cast<double>(size.tokens) / s.step_seconds / 1e12;
  o.hardware_tflops = flops / s.step_seconds / 1e12;
  o.host_ms = s.host_seconds * 1e3;
  o.host_ops = s.host_ops;
  o.recomputes = s.recomputes;
  o.peak_device = s.peak_device_bytes;
  o.peak_host = s.peak_host_bytes;
  o.peak_nvme = s.peak_nvme_bytes;
  return o;
}

void print_outcome(const char* what, const std::string& policy, const outcome& o) {
  std::printf("%-22s %-13s %8.2fB %11.1f %7.1f %7.1f %9.1f %6zu %7zu %9.2f %9.2f %9.2f %7.1f %s\n", what, policy.c_str(),
              static_cast<double>(o.parameters) / 1e9, o.step_seconds * 1e3, o.model_tflops, o.hardware_tflops, o.host_ms,
              o.host_ops, o.recomputes, static_cast<double>(o.peak_device) / 1e9, static_cast<double>(o.peak_host) / 1e9,
              static_cast<double>(o.peak_nvme) / 1e9, o.plan_s, o.feasible ? "yes" : "NO");
}

void print_header(const char* first) {
  std::printf("%-22s %-13s %9s %11s %7s %7s %9s %6s %7s %9s %9s %9s %7s %s\n", first, "policy", "params", "step_ms", "mTFLOP",
              "hTFLOP", "host_ms", "hostop", "reruns", "dev_GB", "host_GB", "nvme_GB", "plan_s", "ok");
}

zoo_options gpt_shape(std::uint32_t layers, std::uint32_t hidden, std::uint32_t heads, std::uint32_t batch, std::uint32_t seq) {
  zoo_options zo;
  zo.layers = layers;
  zo.hidden = hidden;
  zo.heads = heads;
  zo.batch = batch;
  zo.seq = seq;
  zo.precision = zoo_precision::fp16;  // the same bytes as bf16; V100 has no bf16
  return zo;
}

}  // namespace

int run_paper(const paper_args& a) {
  const auto hw = get_profile("v100-32g");
  const auto zo = gpt_shape(50, 4096, 32, a.batch, a.seq);
  std::printf("ZeRO-Offload's 10B GPT (50 layers, hidden 4096, 32 heads, fp16 with fp32 master and Adam), batch %u, "
              "sequence %u, on %s at its %s of device memory\n",
              a.batch, a.seq, hw.name.c_str(), format_bytes(hw.device_bytes).c_str());
  print_header("case");
  std::map<std::string, outcome> got;
  for (const auto& pol : a.policies) {
    got[pol] = plan_once(pol, zo, hw);
    print_outcome("10B paper shape", pol, got[pol]);
  }
  // For comparison, not a target: with global-norm clipping no update starts before the last
  // gradient, so auto's steps can no longer hide behind the backward pass.
  auto clipped = zo;
  clipped.clip_grad_norm = true;
  for (const auto& pol : a.policies)
    if (pol != "checkpoint") print_outcome("10B, clipped (info)", pol, plan_once(pol, clipped, hw));
  bool all = true;
  auto verdict = [&](bool ok, const std::string& what) {
    std::printf("%s  %s\n", ok ? "PASS" : "MISS", what.c_str());
    all = all && ok;
  };
  char buf[320];
  if (got.count("zero-offload")) {
    const auto& z = got["zero-offload"];
    std::snprintf(buf, sizeof buf,
                  "zero-offload hardware TFLOPS %.1f within 25%% of the paper's 40 (30 to 50), feasible: %s", z.hardware_tflops,
                  z.feasible ? "yes" : "no");
    verdict(z.feasible && z.hardware_tflops >= 30 && z.hardware_tflops <= 50, buf);
    if (got.count("auto")) {
      const auto& au = got["auto"];
      const double gain = au.feasible ? z.step_seconds / au.step_seconds : 0;
      std::snprintf(buf, sizeof buf, "auto throughput %.3fx zero-offload's (model TFLOPS %.1f against %.1f; target >= 1.1)",
                    gain, au.model_tflops, z.model_tflops);
      verdict(au.feasible && gain >= 1.1, buf);
    }
  }
  return all ? 0 : 1;
}

int run_largest(const largest_args& a) {
  bool all = true;
  auto verdict = [&](bool ok, const std::string& what) {
    std::printf("%s  %s\n", ok ? "PASS" : "MISS", what.c_str());
    all = all && ok;
  };
  for (const auto& name : a.hw) {
    auto hw = get_profile(name);
    if (!a.host_memory.empty()) hw.host_bytes = parse_size(a.host_memory, "--host-memory");
    if (!a.nvme.empty()) hw.nvme_bytes = parse_size(a.nvme, "--nvme");
    std::printf("largest GPT (GPT-3 proportions: hidden 128 x layers, heads of 128) at batch %u, sequence %u on %s "
                "(host tier %s, NVMe %s)\n",
                a.batch, a.seq, hw.name.c_str(), format_bytes(hw.host_bytes).c_str(), format_bytes(hw.nvme_bytes).c_str());
    print_header("layers / hidden");
    std::map<std::string, std::uint64_t> largest;
    auto search = [&](const std::string& pol, const hw_profile& h, const char* label) {
      std::map<std::uint32_t, outcome> seen;
      auto fits = [&](std::uint32_t L) {
        if (!seen.count(L)) seen[L] = plan_once(pol, gpt_shape(L, 128 * L, L, a.batch, a.seq), h);
        return seen[L].feasible;
      };
      // Doubling, then bisection between the last layers that fit and the first that did not.
      std::uint32_t lo = 0, hi = 4;
      while (hi <= 256 && fits(hi)) {
        lo = hi;
        hi *= 2;
      }
      while (hi - lo > 1) {
        const std::uint32_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      char what[64];
      if (lo == 0) {
        std::snprintf(what, sizeof what, "none (%s)", label);
        print_outcome(what, pol, seen[hi]);
        return std::uint64_t{0};
      }
      std::snprintf(what, sizeof what, "%u / %u %s", lo, 128 * lo, label);
      print_outcome(what, pol, seen[lo]);
      return seen[lo].parameters;
    };
    for (const auto& pol : a.policies) largest[pol] = search(pol, hw, "");
    std::uint64_t auto_no_nvme = 0;
    const bool has_nvme = hw.nvme_bytes > 0 && largest.count("auto");
    if (has_nvme) {
      auto off = hw;
      off.nvme_bytes = 0;
      auto_no_nvme = search("auto", off, "(no NVMe)");
    }
    if (hw.name == "v100-32g" && largest.count("auto") && largest.count("zero-offload")) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "v100-32g: auto's largest GPT %.2fB at least zero-offload's %.2fB (the paper: 13B)",
                    static_cast<double>(largest["auto"]) / 1e9, static_cast<double>(largest["zero-offload"]) / 1e9);
      verdict(largest["auto"] >= largest["zero-offload"] && largest["zero-offload"] > 0, buf);
      if (has_nvme) {
        std::snprintf(buf, sizeof buf, "v100-32g: auto with NVMe %.2fB larger than without %.2fB",
                      static_cast<double>(largest["auto"]) / 1e9, static_cast<double>(auto_no_nvme) / 1e9);
        verdict(largest["auto"] > auto_no_nvme, buf);
      }
    }
  }
  return all ? 0 : 1;
}

}  // namespace spillway::bench
