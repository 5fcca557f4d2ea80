// Command-line flags (CLI11) of the example programs and of spillway-bench: the session_config
// settings under their one name each (--config FILE, --backend, --nvme-directories, ...) and the
// examples' own flags, kept as text until loaded so that a bad value is reported as given.
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "examples/common/options.hpp"
#include "offload/session_config.hpp"

namespace spillway::examples {

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
  std::string report;
  std::string data;
};

/// Adds every session_config flag (add_config_flags), --budget-ratio, --steps, --seed, --preset,
/// --report, and --data when `with_data`.
void add_common_flags(CLI::App& app, flag_values& v, bool with_data);

/// The example_options of these flags (load_config, then the example's own), validated:
/// config_error naming the first bad value and where it came from, before any work.
[[nodiscard]] example_options to_options(const flag_values& v);

}  // namespace spillway::examples
