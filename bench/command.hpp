// Subcommand registry of spillway-bench: each subcommand file registers itself with one
// static `command_registration`, so adding a benchmark touches only its own file and the list
// of sources in bench/meson.build.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "device/units.hpp"
#include "examples/common/flags.hpp"

namespace spillway::bench {

/// Adds a subcommand to `app`; the subcommand's callback runs the benchmark and sets the
/// exit code through `exit_code` (0 when its targets were met or not asked for).
using command_factory = std::function<void(CLI::App& app, int& exit_code)>;

struct command_entry {
  std::string name;
  command_factory factory;
};

std::vector<command_entry>& command_registry();

/// Output files, counts and positive numbers are checked when the flags are read (examples/common/flags.hpp).
using examples::positive_number;
using examples::whole_number;
using examples::whole_number_in;
using examples::writable_file;

/// A CLI11 check for a real number from `lo` to `hi` (a latency, a target time): "nan", "inf"
/// and numbers outside the range are refused as given, with the range, before any work.
inline std::string number_text(double v) {
  return v == std::floor(v) && std::abs(v) < 1e15 ? std::to_string(static_cast<long long>(v)) : format_real(v);
}
inline CLI::Validator number_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < lo || v > hi)
          return "cannot use \"" + text + "\": give a number from " + number_text(lo) + " to " + number_text(hi);
        return {};
      },
      "X", "number in a range");
}

/// The largest counts the flags of spillway-bench take: far past what any real run asks for (the
/// zoo's deepest model, GPT-3-style 13B, has 40 blocks, and GPT-3 175B has 96; the widest, 12288
/// hidden and 96 heads), yet small enough that a run's work stays bounded: planning grows with
/// the blocks (about 1 ms per block per plan), so 1000 blocks plan in about a second.
inline constexpr std::uint64_t max_layers = 1000;
/// Batch, sequence length or image side, hidden size, heads (0 takes the model's own): past these
/// the zoo refuses shapes anyway (tensors past a petabyte).
inline constexpr std::uint64_t max_shape = std::uint64_t{1} << 20;
/// plan --ranks and --ranks-per-node.
inline constexpr std::uint64_t max_ranks = std::uint64_t{1} << 20;
/// plan --early-step-lag and --gather-ahead, in buckets.
inline constexpr std::uint64_t max_buckets = 100000;
/// plan --network-latency-us: one second per ring step.
inline constexpr double max_network_latency_us = 1e6;

struct command_registration {
  command_registration(std::string name, command_factory factory) {
    command_registry().push_back({std::move(name), std::move(factory)});
  }
};

}  // namespace spillway::bench
