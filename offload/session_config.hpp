// The one config struct of a Session: filled in code, from a small JSON file, from SPILLWAY_*
// environment variables or from a program's flags, each setting under one name everywhere.
//
// Names. A setting's key is its field's name ("policy", "nvme.reserve"). From the key come its
// flag (--policy, --nvme-reserve), its variable (SPILLWAY_POLICY, SPILLWAY_NVME_RESERVE) and its
// JSON key ({"policy": ...}, {"nvme": {"reserve": ...}}); settings() lists them all. Sizes are
// written as 1048576, 512MiB, 6GiB or 1.5GB; directory lists as DIR[,DIR...] (JSON: an array).
//
// Precedence: built-in default < JSON file < SPILLWAY_* variable < command-line flag (< code
// that sets a field afterwards). Programs load in that order: from_json_file (when given),
// apply_env, then set() for each flag given.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace spillway {

struct session_config {
  // Where to run.
  std::string backend = "auto";           ///< "auto", "cpu" or "cuda"
  std::uint64_t cpu_device_memory = 0;    ///< cpu backend: emulated device memory; 0 = 1 GiB
  std::uint64_t cpu_callback_seed = 0;    ///< cpu backend: orders host functions ready at once; 0 = 1
  bool cpu_debug_host_access = false;     ///< cpu backend: host access to device memory outside stream work dies
  double link_gbps = 0;                   ///< cpu backend: link GB/s each way; 0 = unlimited

  // How much of each tier to use.
  std::uint64_t device_budget = 0;        ///< 0 = what is free (GPU: less 1/16)
  /// > 0: after the first recorded iteration (run at the device_budget, or what is free), the
  /// Session sets its budget to this fraction of that iteration's footprint (peak live bytes).
  /// 0 < ratio <= 1; not together with device_budget. 0 = not used.
  double device_budget_ratio = 0;
  std::uint64_t host_budget = 0;          ///< 0 = no limit on the host tier
  /// The NVMe tier; the fields are those of nvme_options (swap/nvme_tier.hpp) of the same name.
  struct nvme_settings {
    std::vector<std::string> directories; ///< swap directories, one swap file each, striped
    /// Swap space reserved (fallocate) over all directories. 0 = sized from the plan: the tier
    /// starts small and grows to what the plan places on NVMe (the planner may use what the
    /// file systems have free). Non-zero: reserved at start, and the planner uses exactly that.
    std::uint64_t reserve = 0;
    std::uint64_t block_size = 1 << 20;   ///< bytes per I/O; 1 MiB suits NVMe drives
    std::uint64_t queue_depth = 32;       ///< I/Os in flight per ring
    std::uint64_t rings = 1;              ///< io_uring rings, each with an I/O thread
    /// Milliseconds an I/O may go without completing before its move fails and it is cancelled
    /// (0: wait for ever).
    std::uint64_t io_timeout_ms = 30000;
  } nvme;

  // What to move and when.
  std::string policy = "auto";            ///< none, lms, vdnn, auto, checkpoint, capuchin or zero-offload
  /// Where ops given a host implementation (Session::host_capable_op) run: "auto" (the planner
  /// weighs the host against the device; auto and zero-offload place them), "host" (every one
  /// the plan can serve runs on the host, whatever the policy) or "device".
  std::string host_ops = "auto";
  // lms knobs; 0 = let the planner tune it (it tries a small grid, as TFLMS users do by hand).
  std::uint64_t lms_swapout_threshold = 0;///< lms: ops a tensor must sit idle before it is swapped out
  std::uint64_t lms_swapin_ahead = 0;     ///< lms: ops ahead of use to start a swap-in
  std::uint64_t lms_swapin_groupby = 0;   ///< lms: swap-ins issued together within this many ops
  std::string vdnn_variant = "all";       ///< vdnn: "all" or "conv"

  // Reports and checks.
  std::string chrome_trace;               ///< write a Chrome trace of real iterations here
  /// Debug: each rerun of a recomputable op is compared, bit for bit, with the op's first run in
  /// the iteration; a difference is a usage_error (Note [Checking reruns] in session_rerun_check.cpp).
  bool check_reruns = false;

  /// One setting: its key, what its value looks like, and a line of help for flags and docs.
  struct setting {
    std::string_view key;
    std::string_view value_hint;  ///< "SIZE", "DIR[,DIR...]", "auto|cpu|cuda", ...
    std::string_view help;
  };
  /// Every setting, in the order of the fields above.
  [[nodiscard]] static std::span<const setting> settings();
  /// "--nvme-reserve" for "nvme.reserve".
  [[nodiscard]] static std::string flag_of(std::string_view key);
  /// "SPILLWAY_NVME_RESERVE" for "nvme.reserve".
  [[nodiscard]] static std::string variable_of(std::string_view key);

  /// The defaults, overridden by every SPILLWAY_* variable that is set.
  static session_config from_env();
  /// The defaults, overridden by the keys of a JSON object. `source` names the text in messages
  /// (a file's path).
  static session_config from_json_text(std::string_view json_text, std::string_view source = "session config");
  static session_config from_json_file(const std::string& path);

  /// Applies the set SPILLWAY_* variables on top of this config. A variable Spillway does not
  /// know (a typo, an old name such as SPILLWAY_NVME_PATHS) is a config_error listing the known
  /// ones or giving the new name; so is a value that does not parse. SPILLWAY_TEST_SEED, which
  /// the project's tests read (a run of them with it set builds sessions), is not a setting and
  /// is passed over.
  void apply_env();
  /// Applies the keys of a JSON object on top of this config. Unknown or old keys, wrong types
  /// and bad sizes are config_errors naming the key and `source`.
  void apply_json_text(std::string_view json_text, std::string_view source);
  void apply_json_file(const std::string& path);
  /// Sets the setting `key` from text as a flag or variable would give it; `where` names the
  /// input in messages (the flag, "--nvme-reserve"). config_error when the key is unknown or the
  /// text does not parse.
  void set(std::string_view key, std::string_view text, std::string_view where);

  /// Where the value of `key` came from ("SPILLWAY_POLICY", "--policy", "run.json: \"policy\""),
  /// while the field still holds the value read from there; else the key itself.
  [[nodiscard]] std::string source_of(std::string_view key) const;

  /// Checks every field before any work: names and ranges, and that every NVMe directory exists,
  /// is a directory and is writable, and that a non-zero nvme.reserve fits the file systems'
  /// free space. Throws config_error naming the first bad setting by where it came from.
  void validate() const;

  /// For each key set from an input, that input and the value's text as it was read.
  struct origin {
    std::string where;
    std::string value;
  };
  std::map<std::string, origin, std::less<>> origins;
};

}  // namespace spillway
