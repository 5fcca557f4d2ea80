// spillway-bench alloc: the caching allocator against glibc malloc, its reserved memory on a
// transformer-training allocation pattern, and the pinned host pool's overhead, with targets.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "allocator/caching_allocator.hpp"
#include "allocator/pinned_host_pool.hpp"
#include "bench/command.hpp"
#include "device/device.hpp"
#include "device/units.hpp"

namespace spillway::bench {
namespace {

struct alloc_args {
  std::string backend = "cpu";
  std::string json;
  int pairs = 400000;
  int repeats = 5;
};

// ---- (a) allocate+free pair against glibc ---------------------------------------------------

/// Sizes seen in a training step: half small (norms, biases, scalars), a third medium (layer
/// activations of small models), the rest large (weights, activations, workspaces), up to 32 MiB.
std::vector<std::size_t> size_mix(std::size_t count) {
  std::mt19937_64 rng(42);
  auto log_uniform = [&](double lo, double hi) {
    std::uniform_real_distribution<double> d(std::log(lo), std::log(hi));
    return static_cast<std::size_t>(std::exp(d(rng)));
  };
  std::vector<std::size_t> sizes(count);
  for (auto& n : sizes) {
    const auto r = rng() % 100;
    n = r < 50 ? log_uniform(256, 64 << 10) : r < 85 ? log_uniform(64 << 10, 4 << 20) : log_uniform(4 << 20, 32 << 20);
  }
  return sizes;
}

/// CPU time of this thread in ns: on a loaded machine wall time counts other processes too.
double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

template <class Alloc, class Free>
double time_pairs(const std::vector<std::size_t>& sizes, int pairs, Alloc&& alloc, Free&& release) {
  const std::size_t mask = sizes.size() - 1;
  for (std::size_t i = 0; i < sizes.size() * 2; ++i) release(alloc(sizes[i & mask]), sizes[i & mask]);  // warm up
  const double t0 = thread_cpu_ns();
  for (int i = 0; i < pairs; ++i) {
    const std::size_t n = sizes[static_cast<std::size_t>(i) & mask];
    void* p = alloc(n);
    release(p, n);
  }
  return (thread_cpu_ns() - t0) / pairs;
}

struct pair_result {
  double pair_ns = 0;
  double glibc_pair_ns = 0;
};

pair_result measure_pairs(Device& dev, stream s, int pairs, int repeats) {
  const auto sizes = size_mix(4096);
  caching_allocator ca(dev);
  pair_result best{1e30, 1e30};
  for (int r = 0; r < repeats; ++r) {  // interleaved, best of each: the same conditions for both
    best.pair_ns = std::min(best.pair_ns, time_pairs(sizes, pairs, [&](std::size_t n) { return ca.allocate(n, s); },
                                                     [&](void* p, std::size_t n) { ca.deallocate(p, n, s); }));
    best.glibc_pair_ns = std::min(best.glibc_pair_ns, time_pairs(sizes, pairs, [](std::size_t n) {
      void* p = std::malloc(n);
      asm volatile("" : : "r"(p) : "memory");  // keep the pair from being optimised away
      return p;
    }, [](void* p, std::size_t) { std::free(p); }));
  }
  return best;
}

// ---- (b) transformer training pattern ---------------------------------------------------------

struct model_shape {
  std::size_t layers = 8, hidden = 768, heads = 12, seq = 512, vocab = 32000;
};

struct replay_result {
  std::int64_t allocated_peak = 0;
  std::int64_t reserved_peak = 0;
  std::uint64_t segments_peak = 0;
  std::uint64_t retries = 0;
  int iterations = 0;
};

/// Parameters, gradients and Adam moments in fp32; per-layer activations saved in forward and
/// freed in backward, workspaces per op; logits; the batch size changes once midway.
replay_result replay_training(Device& dev, stream s, const model_shape& m, int iterations) {
  caching_allocator ca(dev);
  struct held {
    void* p;
    std::size_t n;
  };
  auto take = [&](std::size_t n) { return held{ca.allocate(n, s), n}; };
  auto give = [&](held h) { ca.deallocate(h.p, h.n, s); };
  const std::size_t h = m.hidden, f = 4 * m.hidden;
  std::vector<std::size_t> param_sizes{m.vocab * h * 4, m.seq * h * 4};
  for (std::size_t l = 0; l < m.layers; ++l) {
    for (std::size_t n : {3 * h * h, 3 * h, h * h, h, h * f, f, f * h, h, h, h, h, h}) param_sizes.push_back(n * 4);
  }
  std::vector<held> persistent;
  for (std::size_t n : param_sizes) persistent.push_back(take(n));  // parameters
  bool have_state = false;

  for (int it = 0; it < iterations; ++it) {
    const std::size_t batch = it < iterations / 2 ? 8 : 12;
    const std::size_t tokens = batch * m.seq;
    std::vector<std::vector<held>> saved(m.layers);
    held x = take(tokens * h * 2);  // embedding output
    for (std::size_t l = 0; l < m.layers; ++l) {
      auto& keep = saved[l];
      keep.push_back(take(tokens * h * 2));                          // ln1 out
      keep.push_back(take(tokens * 3 * h * 2));                      // qkv
      keep.push_back(take(batch * m.heads * m.seq * m.seq * 2));     // attention probabilities
      held ws = take(4 << 20);                                       // GEMM workspace
      give(ws);
      keep.push_back(take(tokens * h * 2));                          // attention out
      keep.push_back(take(tokens * h * 2));                          // ln2 out
      keep.push_back(take(tokens * f * 2));                          // ffn1 out
      keep.push_back(take(tokens * f * 2));                          // gelu out
      ws = take(tokens * f * 2);                                     // temporary of the fused op
      give(ws);
      keep.push_back(take(tokens * 4 + 64));                         // layer-norm statistics
    }
    held logits = take(tokens * m.vocab * 2);
    held loss_grad = take(tokens * m.vocab * 2);
    give(logits);
    if (!have_state) {  // gradients appear in the first backward pass, Adam moments at the first step
      for (std::size_t n : param_sizes) persistent.push_back(take(n));
    }
    held grad = take(tokens * h * 2);
    give(loss_grad);
    for (std::size_t l = m.layers; l-- > 0;) {
      held g_ffn = take(tokens * f * 2);
      held g_qkv = take(tokens * 3 * h * 2);
      held g_probs = take(batch * m.heads * m.seq * m.seq * 2);
      held ws = take(4 << 20);
      give(ws);
      for (auto it2 = saved[l].rbegin(); it2 != saved[l].rend(); ++it2) give(*it2);
      give(g_probs);
      give(g_qkv);
      give(g_ffn);
      held next = take(tokens * h * 2);
      give(grad);
      grad = next;
    }
    give(grad);
    give(x);
    if (!have_state) {
      for (int k = 0; k < 2; ++k)
        for (std::size_t n : param_sizes) persistent.push_back(take(n));
      have_state = true;
    }
    held step_ws = take(param_sizes.back() * 2);  // optimizer scratch
    give(step_ws);
  }
  const auto st = ca.stats();
  for (auto& p : persistent) give(p);
  replay_result r;
  r.allocated_peak = st.allocated_bytes.peak;
  r.reserved_peak = st.reserved_bytes.peak;
  r.segments_peak = static_cast<std::uint64_t>(st.segment_count.peak);
  r.retries = st.num_alloc_retries;
  r.iterations = iterations;
  return r;
}

// ---- (c) pinned host pool overhead --------------------------------------------------------

struct pinned_result {
  std::size_t requested_peak = 0;
  std::size_t reserved_at_peak = 0;
  std::size_t regions = 0;
  double overhead = 0;
};

/// The host tier of the same model, offloading: weights in fp16 and both Adam moments in fp32
/// stay; every layer's saved activations go out in forward and come back in backward.
pinned_result measure_pinned(Device& dev, const model_shape& m) {
  pinned_host_pool pool(dev);
  const std::size_t h = m.hidden, f = 4 * m.hidden;
  std::vector<std::pair<void*, std::size_t>> resident;
  for (std::size_t w : {2, 4, 4}) {
    for (std::size_t n : {m.vocab * h, m.seq * h}) resident.emplace_back(pool.allocate(n * w), n * w);
    for (std::size_t l = 0; l < m.layers; ++l) {
      for (std::size_t n : {3 * h * h, 3 * h, h * h, h, h * f, f, f * h, h, h, h, h, h})
        resident.emplace_back(pool.allocate(n * w), n * w);
    }
  }
  pinned_result r;
  for (int it = 0; it < 8; ++it) {
    const std::size_t batch = it < 4 ? 8 : 12, tokens = batch * m.seq;
    std::vector<std::pair<void*, std::size_t>> acts;
    for (std::size_t l = 0; l < m.layers; ++l) {
      for (std::size_t n : {tokens * h * 2, tokens * 3 * h * 2, batch * m.heads * m.seq * m.seq * 2, tokens * h * 2,
                            tokens * h * 2, tokens * f * 2, tokens * f * 2, tokens * 4 + 64})
        acts.emplace_back(pool.allocate(n), n);
    }
    const auto st = pool.stats();
    if (st.requested_bytes > r.requested_peak) {
      r.requested_peak = st.requested_bytes;
      r.reserved_at_peak = st.reserved_bytes;
    }
    r.overhead = std::max(r.overhead, static_cast<double>(st.reserved_bytes) / static_cast<double>(st.requested_bytes) - 1);
    for (auto a = acts.rbegin(); a != acts.rend(); ++a) pool.deallocate(a->first, a->second);
  }
  r.regions = pool.regions().size();
  for (auto& [p, n] : resident) pool.deallocate(p, n);
  return r;
}

// ---- the command ----------------------------------------------------------------------------

int run(const alloc_args& a) {
  device_options o;
  o.cpu_device_memory = std::size_t{8} << 30;  // address space only: the benchmark never touches it
  auto dev = make_device(a.backend, o);
  owned_stream s(*dev);
  const model_shape m;

  const auto pairs = measure_pairs(*dev, s, a.pairs, a.repeats);
  const auto replay = replay_training(*dev, s, m, 10);
  const auto pinned = measure_pinned(*dev, m);
  dev->synchronize();

  const double pair_ratio = pairs.pair_ns / pairs.glibc_pair_ns;
  const double reserved_ratio = static_cast<double>(replay.reserved_peak) / static_cast<double>(replay.allocated_peak);
  struct target {
    const char* what;
    bool met;
    std::string detail;
  };
  char buf[256];
  std::vector<target> targets;
  std::snprintf(buf, sizeof buf, "%.1f ns vs glibc %.1f ns (%.2fx, target <= 3x)", pairs.pair_ns, pairs.glibc_pair_ns,
                pair_ratio);
  targets.push_back({"pair_ns <= 3x glibc_pair_ns", pair_ratio <= 3.0, buf});
  std::snprintf(buf, sizeof buf, "%s reserved vs %s allocated at peak (%.3fx, target <= 1.15x)",
                format_bytes(static_cast<std::uint64_t>(replay.reserved_peak)).c_str(),
                format_bytes(static_cast<std::uint64_t>(replay.allocated_peak)).c_str(), reserved_ratio);
  targets.push_back({"reserved_peak_bytes <= 1.15x allocated_peak_bytes", reserved_ratio <= 1.15, buf});
  std::snprintf(buf, sizeof buf, "%s reserved for %s requested (%.2f%%, target <= 5%%)",
                format_bytes(pinned.reserved_at_peak).c_str(), format_bytes(pinned.requested_peak).c_str(),
                pinned.overhead * 100);
  targets.push_back({"pinned overhead <= 5%", pinned.overhead <= 0.05, buf});

  std::cout << "spillway-bench alloc on " << dev->properties().name << "\n"
            << "  (a) allocate+free pair, " << a.pairs << " pairs x " << a.repeats
            << " repeats, best run, thread CPU time, sizes 256 B - 32 MiB\n"
            << "  (b) transformer training replay: " << m.layers << " layers, hidden " << m.hidden << ", seq "
            << m.seq << ", batch 8 -> 12 midway, " << replay.iterations << " iterations, " << replay.segments_peak
            << " segments at peak, " << replay.retries << " retries\n"
            << "  (c) pinned host pool: host tier of the same model, " << pinned.regions << " regions\n";
  bool all = true;
  for (const auto& t : targets) {
    std::cout << (t.met ? "PASS " : "MISS ") << t.what << ": " << t.detail << "\n";
    all = all && t.met;
  }
  if (!a.json.empty()) {
    nlohmann::json j = {{"device", dev->properties().name},
                        {"backend", to_string(dev->properties().backend)},
                        {"pair_ns", pairs.pair_ns},
                        {"glibc_pair_ns", pairs.glibc_pair_ns},
                        {"allocated_peak_bytes", replay.allocated_peak},
                        {"reserved_peak_bytes", replay.reserved_peak},
                        {"segments_peak", replay.segments_peak},
                        {"alloc_retries", replay.retries},
                        {"pinned_requested_bytes", pinned.requested_peak},
                        {"pinned_reserved_bytes", pinned.reserved_at_peak},
                        {"pinned_overhead", pinned.overhead},
                        {"pinned_regions", pinned.regions}};
    for (const auto& t : targets) j["targets"][t.what] = t.met ? "PASS" : "MISS";
    std::ofstream(a.json) << j.dump(2) << "\n";
  }
  return all ? 0 : 1;
}

const command_registration registration{"alloc", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<alloc_args>();
  auto* cmd = app.add_subcommand("alloc", "caching allocator vs glibc, training replay, pinned pool overhead");
  cmd->add_option("--backend", args->backend, "auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--pairs", args->pairs, "allocate+free pairs per timed run")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--repeats", args->repeats, "timed runs (best is kept)")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--json", args->json, "write the figures as JSON");
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}};

}  // namespace
}  // namespace spillway::bench
