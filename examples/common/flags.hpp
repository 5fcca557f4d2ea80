// Command-line flags (CLI11) of the example programs and of spillway-bench: the session_config
// settings under their one name each (--config FILE, --backend, --nvme-directories, ...) and the
// examples' own flags, kept as text until loaded so that a bad value is reported as given.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include "examples/common/options.hpp"
#include "offload/session_config.hpp"

namespace spillway::examples {

/// A CLI11 check for an output file (--report, --json, --chrome-trace, ...): its folder exists
/// and can be written, checked when the flags are read, so that a run does not do its work and
/// then fail to save it. CLI11 puts the flag's name in front of the message.
inline const CLI::Validator writable_file(
    [](std::string& path) -> std::string {
      if (path.empty()) return {};
      const auto slash = path.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
      struct stat st {};
      if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        return "cannot write '" + path + "': the folder '" + dir + "' does not exist";
      if (const auto why = cannot_write_in(dir); !why.empty())
        return "cannot write '" + path + "': the folder '" + dir + "' is not writable (" + why + ")";
      if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        return "cannot write '" + path + "': it is a folder; give a file name in it";
      if (::access(path.c_str(), F_OK) == 0 && ::access(path.c_str(), W_OK) != 0)
        return "cannot write '" + path + "': the file exists and is not writable";
      return {};
    },
    "FILE", "writable file");

/// A CLI11 check for a count written in digits from `lo` to `hi` (--repeats, --iterations,
/// --ops): "-1", which CLI11 would turn into the largest unsigned value, and counts past what
/// the option can use are refused as given, before any work.
inline CLI::Validator whole_number_in(std::uint64_t lo, std::uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        errno = 0;
        const std::uint64_t v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
        if (!digits || errno == ERANGE || v < lo || v > hi)
          return "cannot use \"" + text + "\": give a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
        return {};
      },
      "N", "whole number in a range");
}

/// A CLI11 check for a whole number from 0 to 2^64 - 1 written in digits (a seed): "-1" and
/// numbers past the range are refused as given instead of wrapping or saturating.
inline const CLI::Validator whole_number = whole_number_in(0, std::numeric_limits<std::uint64_t>::max());

/// A CLI11 check for an amount that must be above 0 (--time-limit, --fit-step-ms): CLI's own
/// PositiveNumber refuses 0 as "not in range 0 to 1.8e308", which reads as if 0 were allowed.
inline const CLI::Validator positive_number(
    [](std::string& text) -> std::string {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !(v > 0) || !std::isfinite(v))
        return "cannot use \"" + text + "\": give a number above 0";
      return {};
    },
    "X>0", "positive number");

/// The session_config flags of one program or subcommand, as given.
struct config_flags {
  struct flag {
    std::string key;                   ///< session_config key
    CLI::Option* option = nullptr;
    std::string* text = nullptr;       ///< what it gave (a scalar setting)
    std::vector<std::string>* list = nullptr;  ///< what it gave (--nvme-directories, repeatable)
  };
  std::string config_file;                                  ///< --config FILE
  std::vector<flag> flags;
  std::vector<std::pair<std::string, std::string>> old;     ///< old flag name -> its key now
  std::deque<std::string> texts;                            ///< storage CLI11 writes into (stable)
  std::deque<std::vector<std::string>> lists;
  CLI::App* app = nullptr;
};

/// Adds --config FILE and, for each key of session_config::settings() in `keys` (all when
/// empty), its flag (session_config::flag_of). Old flag names (--nvme-dir, --dir,
/// --device-memory, --block-size, --queue-depth, --rings) are taken only to be refused with the new name. `f` must outlive parsing.
void add_config_flags(CLI::App& app, config_flags& f, std::initializer_list<std::string_view> keys = {});

/// The config of these flags: `defaults` (a program's own built-in defaults; session_config's
/// when not given) < the --config JSON file < SPILLWAY_* variables < the flags given. Not
/// validated (the caller validates once, after its own changes).
[[nodiscard]] session_config load_config(const config_flags& f, session_config defaults = {});

/// The examples' own flags.
struct flag_values {
  config_flags config;
  double budget_ratio = 0;
  int steps = 10;
  std::uint64_t seed = 1;
  std::string preset = "small";
  std::string precision = "fp32";
  std::string report;
  std::string data;
  std::string save;
  int save_every = 0;
  std::string resume;
  double clip_grad_norm = 0;
  int micro_batches = 1;
  bool data_parallel = false;
  int zero = 2;
  std::uint64_t bucket_kib = 1024;
  double comm_timeout_s = 120;
};

/// Adds every session_config flag (add_config_flags), --budget-ratio, --steps, --seed, --preset,
/// --report, --save, --save-every, --resume, --clip-grad-norm, and --data when `with_data`.
void add_common_flags(CLI::App& app, flag_values& v, bool with_data);

/// The example_options of these flags (load_config, then the example's own), validated:
/// config_error naming the first bad value and where it came from, before any work.
[[nodiscard]] example_options to_options(const flag_values& v);

}  // namespace spillway::examples
