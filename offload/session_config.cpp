// Filling a session_config from JSON, the environment or flags through one table of settings,
// and checking it before any work starts. Every error names the input the value came from.
#include "offload/session_config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/text_file.hpp"

extern char** environ;  // NOLINT: POSIX declares it only with _GNU_SOURCE in some headers

namespace spillway {
namespace {

// Names in messages go in single quotes ('greedy'); text that failed to parse in double quotes,
// as parse_size writes it ("4.1XB").
std::string in_quotes(std::string_view text) { return "'" + std::string(text) + "'"; }
std::string as_given(std::string_view text) { return "\"" + std::string(text) + "\""; }

std::uint64_t parse_count(std::string_view text, const std::string& where, std::uint64_t max) {
  std::uint64_t v = 0;
  std::size_t used = 0;
  try {
    if (!text.empty() && text.front() != '-') v = std::stoull(std::string(text), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v > max)
    throw config_error(where + ": cannot use " + as_given(text) + ": give a whole number from 0 to " + std::to_string(max));
  return v;
}

// std::from_chars, not std::stod: stod reads the decimal point of the C locale, so in a program
// that has set a German or French one "0.25" stopped at the point and was refused.
double parse_real(std::string_view text, const std::string& where) {
  std::string_view digits = text;
  while (!digits.empty() && std::isspace(static_cast<unsigned char>(digits.front()))) digits.remove_prefix(1);
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  double v = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  const bool whole = r.ec == std::errc{} && r.ptr == digits.data() + digits.size() && !digits.empty();
  if (!whole || !std::isfinite(v) || v < 0)
    throw config_error(where + ": cannot use " + as_given(text) + ": give a number >= 0, such as 12.5");
  return v;
}

bool parse_bool(std::string_view text, const std::string& where) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  throw config_error(where + ": cannot use " + as_given(text) + ": give true or false");
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string join_list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::string show_real(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

// Where a setting's value lives: a member of session_config, or of its nvme block.
template <class T>
struct place {
  T session_config::*top = nullptr;
  T session_config::nvme_settings::*nvme = nullptr;
  [[nodiscard]] T& of(session_config& c) const { return top != nullptr ? c.*top : c.nvme.*nvme; }
  [[nodiscard]] const T& of(const session_config& c) const { return top != nullptr ? c.*top : c.nvme.*nvme; }
};

// How a setting's text becomes its value.
enum class read_as : std::uint8_t { text, list, real, size, positive_size, count, boolean };

// One row per setting: its names and help (public), how its text is read, where the value goes,
// and (counts) the largest value allowed.
struct row {
  session_config::setting names;
  read_as as;
  std::variant<place<std::string>, place<std::vector<std::string>>, place<double>, place<std::uint64_t>, place<bool>> at;
  std::uint64_t max = 0;

  void assign(session_config& c, std::string_view t, const std::string& where) const {
    switch (as) {
      case read_as::text: std::get<place<std::string>>(at).of(c) = std::string(t); break;
      case read_as::list: std::get<place<std::vector<std::string>>>(at).of(c) = split_list(t); break;
      case read_as::real: std::get<place<double>>(at).of(c) = parse_real(t, where); break;
      case read_as::size: std::get<place<std::uint64_t>>(at).of(c) = parse_size(t, where, true); break;
      case read_as::positive_size: std::get<place<std::uint64_t>>(at).of(c) = parse_size(t, where); break;
      case read_as::count: std::get<place<std::uint64_t>>(at).of(c) = parse_count(t, where, max); break;
      case read_as::boolean: std::get<place<bool>>(at).of(c) = parse_bool(t, where); break;
    }
  }
  /// The value as text, to tell whether the field still holds what an input gave.
  [[nodiscard]] std::string show(const session_config& c) const {
    switch (as) {
      case read_as::text: return std::get<place<std::string>>(at).of(c);
      case read_as::list: return join_list(std::get<place<std::vector<std::string>>>(at).of(c));
      case read_as::real: return show_real(std::get<place<double>>(at).of(c));
      case read_as::boolean: return std::get<place<bool>>(at).of(c) ? "true" : "false";
      default: return std::to_string(std::get<place<std::uint64_t>>(at).of(c));
    }
  }
};

using sc = session_config;
using nv = session_config::nvme_settings;
constexpr std::uint64_t u32_max = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

const row rows[] = {
    {{"backend", "auto|cpu|cuda", "where to run: cuda when a GPU answers (auto), the cpu backend, or cuda"},
     read_as::text, place<std::string>{&sc::backend}},
    {{"cpu_device_memory", "SIZE", "cpu backend: emulated device memory (0: 1 GiB)"},
     read_as::size, place<std::uint64_t>{&sc::cpu_device_memory}},
    {{"cpu_callback_seed", "N", "cpu backend: seed of the order of host functions ready at once (0: 1)"},
     read_as::count, place<std::uint64_t>{&sc::cpu_callback_seed}, u64_max},
    {{"cpu_debug_host_access", "true|false", "cpu backend, debug: host code touching device memory outside a kernel or op.run dies naming the address (catches most such accesses)"},
     read_as::boolean, place<bool>{&sc::cpu_debug_host_access}},
    {{"link_gbps", "GBPS", "cpu backend: host<->device link GB/s each way (0: unlimited)"},
     read_as::real, place<double>{&sc::link_gbps}},
    {{"device_budget", "SIZE", "device memory Spillway may use (0: what is free when the Session opens)"},
     read_as::size, place<std::uint64_t>{&sc::device_budget}},
    {{"device_budget_ratio", "RATIO", "device budget as a fraction (0 < r <= 1) of the footprint of the first recorded iteration (0: not used)"},
     read_as::real, place<double>{&sc::device_budget_ratio}},
    {{"host_budget", "SIZE", "pinned host tier capacity (0: no limit)"},
     read_as::size, place<std::uint64_t>{&sc::host_budget}},
    {{"nvme.directories", "DIR[,DIR...]", "NVMe-tier swap directories, one per drive, striped"},
     read_as::list, place<std::vector<std::string>>{nullptr, &nv::directories}},
    {{"nvme.reserve", "SIZE", "swap space reserved over the NVMe directories (0: sized from the plan)"},
     read_as::size, place<std::uint64_t>{nullptr, &nv::reserve}},
    {{"nvme.block_size", "SIZE", "NVMe tier: bytes per I/O, a multiple of the drives' O_DIRECT alignment"},
     read_as::positive_size, place<std::uint64_t>{nullptr, &nv::block_size}},
    {{"nvme.queue_depth", "N", "NVMe tier: I/Os in flight per ring"},
     read_as::count, place<std::uint64_t>{nullptr, &nv::queue_depth}, 4096},
    {{"nvme.rings", "N", "NVMe tier: io_uring rings, each with its own I/O thread"},
     read_as::count, place<std::uint64_t>{nullptr, &nv::rings}, 64},
    {{"nvme.io_timeout_ms", "MS", "NVMe tier: milliseconds an I/O may take before its move fails and it is cancelled (0: no limit)"},
     read_as::count, place<std::uint64_t>{nullptr, &nv::io_timeout_ms}, 86'400'000},
    {{"policy", "none|lms|vdnn|checkpoint|capuchin|zero-offload|auto", "swap policy"}, read_as::text, place<std::string>{&sc::policy}},
    {{"host_ops", "auto|host|device", "where ops given a host implementation (host_capable_op) run: as the planner finds best, on the host, or on the device"},
     read_as::text, place<std::string>{&sc::host_ops}},
    {{"lms_swapout_threshold", "N", "lms: ops a tensor must sit idle before it is swapped out (0: tuned)"},
     read_as::count, place<std::uint64_t>{&sc::lms_swapout_threshold}, u32_max},
    {{"lms_swapin_ahead", "N", "lms: ops ahead of use to start a swap-in (0: tuned)"},
     read_as::count, place<std::uint64_t>{&sc::lms_swapin_ahead}, u32_max},
    {{"lms_swapin_groupby", "N", "lms: swap-ins issued together within this many ops (0: tuned)"},
     read_as::count, place<std::uint64_t>{&sc::lms_swapin_groupby}, u32_max},
    {{"vdnn_variant", "all|conv", "vdnn: offload every layer's input, or only convolutions'"},
     read_as::text, place<std::string>{&sc::vdnn_variant}},
    {{"chrome_trace", "FILE", "write a Chrome trace of the real iterations here"},
     read_as::text, place<std::string>{&sc::chrome_trace}},
    {{"check_reruns", "true|false", "debug: compare each rerun of a recomputable op with its first run, bit for bit; a difference is an error naming the op and the value (each such op waits for its stream)"},
     read_as::boolean, place<bool>{&sc::check_reruns}},
};

const row* find_row(std::string_view key) {
  for (const auto& r : rows)
    if (r.names.key == key) return &r;
  return nullptr;
}

/// Names a user may still have set from before settings had one name each, and the new key.
struct old_name {
  std::string_view old_key;
  std::string_view key;
};
constexpr old_name old_names[] = {{"device", "backend"}, {"nvme_paths", "nvme.directories"},
                                  {"nvme_dirs", "nvme.directories"}, {"nvme_reserve", "nvme.reserve"}};

// SPILLWAY_* variables the project reads outside the library, which apply_env passes over: the
// seed the randomized tests add to their own (tests/test_seed.hpp; scripts/soak sets it), so
// that a whole test run with it set also runs the tests that build sessions from the
// environment.
constexpr std::string_view not_settings[] = {"SPILLWAY_TEST_SEED"};

std::string known_keys() {
  std::string out;
  for (const auto& r : rows) out += (out.empty() ? "" : ", ") + std::string(r.names.key);
  return out;
}

std::string known_variables() {
  std::string out;
  for (const auto& r : rows) out += (out.empty() ? "" : ", ") + session_config::variable_of(r.names.key);
  return out;
}

// The JSON value of a scalar setting as the text a flag would give.
std::string json_scalar_text(const nlohmann::json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_unsigned() || v.is_number_integer()) return v.dump();
  if (v.is_number_float()) return show_real(v.get<double>());
  throw config_error(where + ": must be a string, a number or true/false, not " + v.dump());
}

// Tries to create a file in `dir` the way the NVMe tier will (an unnamed file, else a named one
// removed at once). Returns 0 or the errno.
int try_write(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return 0;
  }
  if (errno != EOPNOTSUPP && errno != EISDIR) return errno;
  std::string path = dir + "/.spillway-check-XXXXXX";
  fd = ::mkstemp(path.data());
  if (fd < 0) return errno;
  ::unlink(path.c_str());
  ::close(fd);
  return 0;
}

}  // namespace

std::span<const session_config::setting> session_config::settings() {
  static const std::vector<setting> all = [] {
    std::vector<setting> v;
    for (const auto& r : rows) v.push_back(r.names);
    return v;
  }();
  return all;
}

std::string session_config::flag_of(std::string_view key) {
  std::string f = "--";
  for (char c : key) f += (c == '_' || c == '.') ? '-' : c;
  return f;
}

std::string session_config::variable_of(std::string_view key) {
  std::string v = "SPILLWAY_";
  for (char c : key) v += (c == '.') ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return v;
}

void session_config::set(std::string_view key, std::string_view text, std::string_view where) {
  const row* r = find_row(key);
  if (r == nullptr) throw config_error(std::string(where) + ": unknown setting \"" + std::string(key) + "\" (known: " + known_keys() + ")");
  r->assign(*this, text, std::string(where));
  origins.insert_or_assign(std::string(key), origin{std::string(where), r->show(*this)});
}

std::string session_config::source_of(std::string_view key) const {
  const row* r = find_row(key);
  auto it = origins.find(key);
  if (r != nullptr && it != origins.end() && it->second.value == r->show(*this)) return it->second.where;
  return std::string(key);
}

void session_config::apply_env() {
  // Every SPILLWAY_* name first: a typo must not run silently, whatever else is set.
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!entry.starts_with("SPILLWAY_")) continue;
    const std::string name(entry.substr(0, entry.find('=')));
    bool known = std::find(std::begin(not_settings), std::end(not_settings), name) != std::end(not_settings);
    for (const auto& r : rows) known = known || variable_of(r.names.key) == name;
    if (known) continue;
    for (const auto& o : old_names) {
      if (variable_of(o.old_key) == name)
        throw config_error(name + " is no longer read: the setting is now " + variable_of(o.key) + " (flag " +
                           flag_of(o.key) + ")");
    }
    throw config_error(name + " is not a Spillway setting (known variables: " + known_variables() + ")");
  }
  for (const auto& r : rows) {
    const std::string name = variable_of(r.names.key);
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) continue;
    // Set but empty is a mistake to report (a script that lost its value), not a default.
    if (*v == '\0') throw config_error(name + " is set but empty; give a value (" + std::string(r.names.value_hint) +
                                        ") or unset it for the default");
    set(r.names.key, v, name);
  }
}

session_config session_config::from_env() {
  session_config c;
  c.apply_env();
  return c;
}

void session_config::apply_json_text(std::string_view text, std::string_view source_in) {
  const std::string source(source_in);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // syntax, or a number too large for a double
    throw config_error(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw config_error(source + ": expected a JSON object of settings, such as {\"policy\": \"auto\"}");
  auto apply = [&](const std::string& key, const nlohmann::json& v) {
    const std::string where = source + ": " + key;
    for (const auto& o : old_names) {
      if (o.old_key == key)
        throw config_error(where + ": this setting is now \"" + std::string(o.key) + "\"" +
                           (o.key == "nvme.directories" || o.key == "nvme.reserve"
                                ? " (written {\"nvme\": {\"" + std::string(o.key.substr(5)) + "\": ...}})"
                                : ""));
    }
    const row* r = find_row(key);
    if (r == nullptr) throw config_error(where + ": unknown setting (known: " + known_keys() + ")");
    if (key == "nvme.directories") {
      if (!v.is_array()) throw config_error(where + ": must be an array of directory paths, not " + v.dump());
      std::vector<std::string> dirs;
      for (const auto& p : v) {
        if (!p.is_string()) throw config_error(where + ": must hold strings, not " + p.dump());
        dirs.push_back(p.get<std::string>());
      }
      nvme.directories = std::move(dirs);
      origins.insert_or_assign(key, origin{where, r->show(*this)});
      return;
    }
    const auto hint = r->names.value_hint;
    const bool numeric = r->as != read_as::text && r->as != read_as::list;  // sizes, counts, reals
    if (!numeric && !v.is_string()) throw config_error(where + ": must be a string (" + std::string(hint) + "), not " + v.dump());
    set(key, json_scalar_text(v, where), where);
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "nvme") {
      if (!v.is_object())
        throw config_error(source + ": nvme: must be an object such as {\"directories\": [\"/mnt/a\"], \"reserve\": \"4GiB\"}");
      for (const auto& [sub, sv] : v.items()) apply("nvme." + sub, sv);
    } else {
      apply(key, v);
    }
  }
}

void session_config::apply_json_file(const std::string& path) {
  apply_json_text(offload::read_text_file(path, "the config file", "a JSON file of settings, such as {\"policy\": \"auto\"}"),
                  path);
}

session_config session_config::from_json_text(std::string_view text, std::string_view source) {
  session_config c;
  c.apply_json_text(text, source);
  return c;
}

session_config session_config::from_json_file(const std::string& path) {
  session_config c;
  c.apply_json_file(path);
  return c;
}

void session_config::validate() const {
  auto bad = [&](std::string_view key, const std::string& what) {
    throw config_error(source_of(key) + ": " + what);
  };
  if (backend != "auto" && backend != "cpu" && backend != "cuda")
    bad("backend", in_quotes(backend) + " is not a backend (auto, cpu, cuda)");
  if (policy != "none" && policy != "lms" && policy != "vdnn" && policy != "auto" && policy != "checkpoint" &&
      policy != "capuchin" && policy != "zero-offload")
    bad("policy", in_quotes(policy) + " is not a policy (none, lms, vdnn, auto, checkpoint, capuchin, zero-offload)");
  if (host_ops != "auto" && host_ops != "host" && host_ops != "device")
    bad("host_ops", in_quotes(host_ops) + " is not a host-op placement (auto, host, device)");
  if (vdnn_variant != "all" && vdnn_variant != "conv")
    bad("vdnn_variant", in_quotes(vdnn_variant) + " is not a vdnn variant (all, conv)");
  for (auto [key, v] : {std::pair{"cpu_device_memory", cpu_device_memory}, std::pair{"device_budget", device_budget},
                        std::pair{"host_budget", host_budget}, std::pair{"nvme.reserve", nvme.reserve}}) {
    if (v > max_size_bytes) bad(key, format_bytes(v) + " is past 1 PiB; write sizes as 6GiB, 512MiB, ...");
  }
  // The cpu backend's device must hold at least one arena granule and a little more to do anything.
  if (cpu_device_memory != 0 && cpu_device_memory < (std::uint64_t{1} << 20))
    bad("cpu_device_memory", format_bytes(cpu_device_memory) +
                                 " is too small for an emulated device; give at least 1MiB (0: the default, 1 GiB)");
  if (!std::isfinite(device_budget_ratio) || device_budget_ratio < 0 || device_budget_ratio > 1)
    bad("device_budget_ratio", show_real(device_budget_ratio) +
                                   " is not a fraction of the footprint; give a ratio above 0 and at most 1, such as 0.25");
  if (device_budget_ratio > 0 && device_budget != 0)
    bad("device_budget_ratio", "it and " + source_of("device_budget") + " both set the device budget; give one");
  if (!std::isfinite(link_gbps) || link_gbps < 0)
    bad("link_gbps", show_real(link_gbps) + " is not a link speed; give GB/s >= 0 (0: unlimited)");
  for (auto [key, v] : {std::pair{"lms_swapout_threshold", lms_swapout_threshold},
                        std::pair{"lms_swapin_ahead", lms_swapin_ahead}, std::pair{"lms_swapin_groupby", lms_swapin_groupby}}) {
    if (v > u32_max) bad(key, std::to_string(v) + " is too large; give at most " + std::to_string(u32_max) + " ops");
  }
  if (!chrome_trace.empty()) {
    const auto slash = chrome_trace.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : chrome_trace.substr(0, std::max<std::size_t>(slash, 1));
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      bad("chrome_trace", in_quotes(chrome_trace) + ": the folder '" + dir + "' does not exist");
    else if (::stat(chrome_trace.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      bad("chrome_trace", in_quotes(chrome_trace) + " is a folder; give a file name in it, such as " +
                              in_quotes(chrome_trace + (chrome_trace.back() == '/' ? "" : "/") + "trace.json"));
    else if (const int err = try_write(dir); err != 0)
      bad("chrome_trace", in_quotes(chrome_trace) + ": the folder '" + dir + "' is not writable: cannot create a file there: " +
                              std::strerror(err) + "; give a path in a folder this program may write");
  }
  if (nvme.block_size < 512 || nvme.block_size > (1u << 30) || nvme.block_size % 512 != 0)
    bad("nvme.block_size", format_bytes(nvme.block_size) + " is not a block size; give a multiple of 512 B up to 1 GiB, such as 1MiB");
  if (nvme.queue_depth < 1 || nvme.queue_depth > 4096)
    bad("nvme.queue_depth", std::to_string(nvme.queue_depth) + " is not a queue depth; give 1 to 4096");
  if (nvme.rings < 1 || nvme.rings > 64) bad("nvme.rings", std::to_string(nvme.rings) + " is not a ring count; give 1 to 64");
  // NVMe: each directory usable now, and a fixed reserve within what the file systems have free.
  const auto& dirs = nvme.directories;
  if (nvme.reserve != 0 && dirs.empty())
    bad("nvme.reserve", format_bytes(nvme.reserve) + " of swap space asked for, but no NVMe directory is given (" +
                            flag_of("nvme.directories") + ", " + variable_of("nvme.directories") + ")");
  std::map<dev_t, std::pair<std::uint64_t, std::string>> free_by_fs;  // file system -> (free bytes, a directory)
  std::map<dev_t, std::uint64_t> share_by_fs;
  std::map<std::pair<dev_t, ino_t>, std::string> seen;  // each folder once, however spelled
  const std::uint64_t share = dirs.empty() ? 0 : (nvme.reserve + dirs.size() - 1) / dirs.size();
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    const std::string& d = dirs[i];
    const std::string which = "'" + d + "'";
    if (d.empty()) bad("nvme.directories", "an empty directory name was given");
    if (std::find(dirs.begin(), dirs.begin() + static_cast<std::ptrdiff_t>(i), d) != dirs.begin() + static_cast<std::ptrdiff_t>(i))
      bad("nvme.directories", which + " is listed twice; give each directory once (one per drive)");
    struct stat st {};
    if (::stat(d.c_str(), &st) != 0)
      bad("nvme.directories", which + " cannot be used: " + std::strerror(errno) + "; give existing directories");
    if (!S_ISDIR(st.st_mode)) bad("nvme.directories", which + " is not a directory");
    if (auto [it, fresh] = seen.try_emplace({st.st_dev, st.st_ino}, d); !fresh)
      bad("nvme.directories", which + " is the folder '" + it->second +
                                  "' again, by another name; give each directory once (one per drive)");
    if (const int err = try_write(d); err != 0)
      bad("nvme.directories", which + " is not writable: cannot create a file there: " + std::strerror(err));
    struct statvfs vfs {};
    if (::statvfs(d.c_str(), &vfs) == 0)
      free_by_fs.try_emplace(st.st_dev, static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize, d);
    share_by_fs[st.st_dev] += share;
  }
  if (nvme.reserve != 0) {
    for (const auto& [fs, need] : share_by_fs) {
      auto it = free_by_fs.find(fs);
      if (it == free_by_fs.end() || need <= it->second.first) continue;
      bad("nvme.reserve", format_bytes(nvme.reserve) + " does not fit: it puts " + format_bytes(need) +
                              " on the file system of '" + it->second.second + "', which has " +
                              format_bytes(it->second.first) + " free; give less, or 0 to size it from the plan");
    }
  }
}

}  // namespace spillway
