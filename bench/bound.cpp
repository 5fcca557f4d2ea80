// spillway-bench bound: the lower bound's own targets with PASS/MISS: how close it comes on a
// case whose best step is known, how long it takes on large traces, and its parts on the zoo.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>

#include "bench/command.hpp"
#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "offload/simulator.hpp"
#include "offload/zoo.hpp"

namespace spillway::bench {

namespace {
using namespace spillway::offload;

struct bound_args {
  std::string hw = "h200";
  std::size_t ops = 50000;
};

// Two 1 GB parameters read by turns over 10 ops of 1 ms, a 10 GB/s link, a budget that holds
// one: every op waits for its parameter (100 ms) while the other cannot stay, so the best step
// is about 10 x (100 + 1) = 1010 ms.
double alternating_bound_ms() {
  trace t;
  const auto a = t.add_tensor("p0", 1'000'000'000, tensor_kind::parameter);
  const auto b = t.add_tensor("p1", 1'000'000'000, tensor_kind::parameter);
  for (int k = 0; k < 10; ++k) {
    op_desc op;
    op.name = "use" + std::to_string(k);
    op.reads = {k % 2 == 0 ? a : b};
    op.measured_seconds = 1e-3;
    t.add_op(std::move(op));
  }
  auto hw = get_profile("h200");
  hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = 10e9;
  return compute_bounds(t, analyze(t), hw, 1'000'000'000).lower_bound_seconds * 1e3;
}

// GPT-2-small shapes with enough blocks for about `ops` ops (as bench plan's speed target).
trace trace_of_about(std::size_t ops) {
  zoo_options zo{0, 0, 1};
  const auto one = make_model_trace("gpt2-small", zo).ops.size();
  zo.layers = 2;
  const auto step = make_model_trace("gpt2-small", zo).ops.size() - one;
  zo.layers = static_cast<std::uint32_t>(1 + (ops - std::min(ops, one) + step - 1) / step);
  return make_model_trace("gpt2-small", zo);
}

int run_bound(const bound_args& a) {
  bool all_pass = true;
  auto verdict = [&](bool ok, const std::string& what) {
    std::printf("%s  %s\n", ok ? "PASS" : "MISS", what.c_str());
    all_pass = all_pass && ok;
  };
  char buf[320];
  const auto hw = get_profile(a.hw);  // an unknown profile is refused before any work
  const double alt = alternating_bound_ms();
  std::snprintf(buf, sizeof buf, "alternating parameters: lower bound %.1f ms, best step ~1010 ms, ratio %.3f (target <= 1.2)",
                alt, 1010.0 / alt);
  verdict(1010.0 / alt <= 1.2, buf);
  for (std::size_t ops : {a.ops, std::size_t{10000}}) {
    const auto t = trace_of_about(ops);
    const auto rep = analyze(t);
    // Process CPU time beside wall time: on a shared machine the wall time counts other work.
    const std::clock_t c0 = std::clock();
    const auto t0 = std::chrono::steady_clock::now();
    const auto b = compute_bounds(t, rep, hw, rep.peak_live_bytes / 4);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    std::snprintf(buf, sizeof buf,
                  "compute_bounds on a %zu-op trace (gpt2-small, %zu tensors, budget 1/4 of peak, %s) in %.3f s CPU, %.3f s wall "
                  "(target <= 2 s); lower bound %.1f ms, ideal %.1f ms",
                  t.ops.size(), t.tensors.size(), hw.name.c_str(), cpu, sec, b.lower_bound_seconds * 1e3, b.ideal_seconds * 1e3);
    verdict(std::min(cpu, sec) <= 2.0, buf);
  }
  std::printf("\n%-12s %6s %10s %10s %10s %10s %10s %10s %10s\n", "model", "budget", "ideal_ms", "state_ms", "volume_ms",
              "order_ms", "window_ms", "lower_ms", "bound_s");
  for (const auto& m : zoo_model_names()) {
    const auto t = make_model_trace(m);
    const auto rep = analyze(t);
    for (int div : {4, 8}) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto b = compute_bounds(t, rep, hw, rep.peak_live_bytes / static_cast<std::uint64_t>(div));
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%-12s %6s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.3f\n", m.c_str(), div == 4 ? "1/4" : "1/8",
                  b.ideal_seconds * 1e3, b.state_bound_seconds * 1e3, b.volume_bound_seconds * 1e3, b.order_bound_seconds * 1e3,
                  b.window_bound_seconds * 1e3, b.lower_bound_seconds * 1e3, sec);
    }
  }
  return all_pass ? 0 : 1;
}

const command_registration registration{"bound", [](CLI::App& app, int& exit_code) {
  auto a = std::make_shared<bound_args>();
  auto* sub = app.add_subcommand("bound", "the lower bound: tightness on a known case, time on large traces, zoo table");
  sub->add_option("--hw", a->hw, "hardware profile name or .json for the timing and the zoo table");
  sub->add_option("--ops", a->ops, "ops of the large trace (gpt2-small shapes)")->check(whole_number_in(1, 1000000));
  sub->callback([a, &exit_code] { exit_code = run_bound(*a); });
}};

}  // namespace

}  // namespace spillway::bench
