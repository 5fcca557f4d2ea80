// Subcommand registry of spillway-bench: each subcommand file registers itself with one
// static `command_registration`, so adding a benchmark touches only its own file and the list
// of sources in bench/meson.build.
#pragma once

#include <CLI/CLI.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

namespace spillway::bench {

/// Adds a subcommand to `app`; the subcommand's callback runs the benchmark and sets the
/// exit code through `exit_code` (0 when its targets were met or not asked for).
using command_factory = std::function<void(CLI::App& app, int& exit_code)>;

struct command_entry {
  std::string name;
  command_factory factory;
};

std::vector<command_entry>& command_registry();

/// A CLI11 check for an output file (--json, --svg, --chrome-trace, ...): its folder exists and
/// can be written, checked when the flags are read, so that a run does not do its work and then
/// fail to save it. CLI11 puts the flag's name in front of the message.
inline const CLI::Validator writable_file(
    [](std::string& path) -> std::string {
      if (path.empty()) return {};
      const auto slash = path.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
      struct stat st {};
      if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        return "cannot write '" + path + "': the folder '" + dir + "' does not exist";
      if (::access(dir.c_str(), W_OK) != 0) return "cannot write '" + path + "': the folder '" + dir + "' is not writable";
      if (::access(path.c_str(), F_OK) == 0 && ::access(path.c_str(), W_OK) != 0)
        return "cannot write '" + path + "': the file exists and is not writable";
      return {};
    },
    "FILE", "writable file");

struct command_registration {
  command_registration(std::string name, command_factory factory) {
    command_registry().push_back({std::move(name), std::move(factory)});
  }
};

}  // namespace spillway::bench
