// Subcommand registry of spillway-bench: each subcommand file registers itself with one
// static `command_registration`, so adding a benchmark touches only its own file and the list
// of sources in bench/meson.build.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

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

struct command_registration {
  command_registration(std::string name, command_factory factory) {
    command_registry().push_back({std::move(name), std::move(factory)});
  }
};

}  // namespace spillway::bench
