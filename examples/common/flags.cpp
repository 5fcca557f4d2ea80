// The session_config flags shared by the examples and spillway-bench, loaded in the order of
// precedence (defaults < --config file < SPILLWAY_* < flags), and the examples' own flags.
#include "examples/common/flags.hpp"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "device/error.hpp"

namespace spillway::examples {
namespace {

/// Flags a user may still type from before each setting had one name.
constexpr std::pair<std::string_view, std::string_view> old_flags[] = {
    {"--nvme-dir", "nvme.directories"}, {"--dir", "nvme.directories"}, {"--device-memory", "cpu_device_memory"},
    {"--block-size", "nvme.block_size"}, {"--queue-depth", "nvme.queue_depth"}, {"--rings", "nvme.rings"}};

// Whether two paths name one file: the same file where both exist, else the same path once
// made absolute and normal (an output not written yet).
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  const auto ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  if (!ea && !eb) return ca == cb;
  return fs::absolute(a, ea).lexically_normal() == fs::absolute(b, eb).lexically_normal();
}

// An output that names an input, or another output, would replace it when the run ends (a
// corpus overwritten by the report): refused before any work.
void check_outputs(const flag_values& v, const example_options& o) {
  struct named {
    const char* flag;
    std::string path;
  };
  const named outputs[] = {{"--report", v.report}, {"--chrome-trace", o.chrome_trace}};
  const named inputs[] = {{"--data", v.data}, {"--config", v.config.config_file}};
  for (std::size_t i = 0; i < std::size(outputs); ++i) {
    const auto& out = outputs[i];
    if (out.path.empty()) continue;
    auto refuse = [&](const named& other, const char* kind) {
      throw config_error(std::string(out.flag) + " '" + out.path + "' is the same file as " + other.flag + " '" +
                         other.path + "', " + kind + "; give another path for " + out.flag);
    };
    for (const auto& in : inputs)
      if (!in.path.empty() && same_file(out.path, in.path)) refuse(in, "which the run reads: writing it would replace it");
    for (std::size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && same_file(out.path, outputs[j].path)) refuse(outputs[j], "another output of the run");
  }
}

}  // namespace

void add_config_flags(CLI::App& app, config_flags& f, std::initializer_list<std::string_view> keys) {
  f.app = &app;
  app.add_option("--config", f.config_file,
                 "JSON file of settings, e.g. {\"policy\": \"auto\", \"nvme\": {\"directories\": [\"/mnt/a\"]}}; "
                 "SPILLWAY_* variables and flags override it")
      ->type_name("FILE");
  for (const auto& s : session_config::settings()) {
    if (keys.size() != 0 && std::find(keys.begin(), keys.end(), s.key) == keys.end()) continue;
    const std::string flag = session_config::flag_of(s.key);
    const std::string help = std::string(s.help) + " (" + session_config::variable_of(s.key) + ")";
    config_flags::flag entry{std::string(s.key)};
    if (s.key == "nvme.directories") {
      entry.list = &f.lists.emplace_back();
      entry.option = app.add_option(flag, *entry.list, help)->delimiter(',');
    } else {
      entry.text = &f.texts.emplace_back();
      entry.option = app.add_option(flag, *entry.text, help);
    }
    entry.option->type_name(std::string(s.value_hint));
    f.flags.push_back(std::move(entry));
    for (const auto& [old, key] : old_flags) {
      if (key != s.key || app.get_option_no_throw(std::string(old)) != nullptr) continue;
      app.add_option(std::string(old), f.texts.emplace_back())->group("");  // hidden: refused in load_config
      f.old.emplace_back(std::string(old), std::string(key));
    }
  }
}

session_config load_config(const config_flags& f, session_config defaults) {
  for (const auto& [old, key] : f.old) {
    if (f.app != nullptr && f.app->count(old) > 0)
      throw config_error(old + " is no longer a flag: the setting is now " + session_config::flag_of(key) + " (" +
                         session_config::variable_of(key) + ")");
  }
  session_config c = std::move(defaults);
  if (!f.config_file.empty()) c.apply_json_file(f.config_file);
  c.apply_env();
  for (const auto& flag : f.flags) {
    if (flag.option->count() == 0) continue;
    std::string given;
    if (flag.list != nullptr) {
      for (const auto& d : *flag.list) given += (given.empty() ? "" : ",") + d;
    } else {
      given = *flag.text;
    }
    c.set(flag.key, given, session_config::flag_of(flag.key));
  }
  return c;
}

void add_common_flags(CLI::App& app, flag_values& v, bool with_data) {
  add_config_flags(app, v.config);
  app.add_option("--budget-ratio", v.budget_ratio,
                 "device budget as a fraction of the model's footprint (learned by a first one-step run; 0: none)");
  app.add_option("--steps", v.steps, "training steps")->capture_default_str();
  app.add_option("--seed", v.seed, "seed of initial weights and data")->check(whole_number)->capture_default_str();
  app.add_option("--preset", v.preset, "model size: tiny, small (under 1 s/step on 2 cpu cores), medium, large (GPU)")
      ->capture_default_str();
  app.add_option("--precision", v.precision,
                 "number format: fp32, or bf16 (bf16 weights, activations and gradients; fp32 master weights and "
                 "Adam moments)")
      ->capture_default_str();
  app.add_option("--report", v.report, "write a JSON report of the run here")->check(writable_file);
  app.add_option("--save", v.save, "save a checkpoint (every persistent tensor and the step) into this folder at the end")
      ->type_name("DIR");
  app.add_option("--save-every", v.save_every, "with --save: also save every N steps")->type_name("N");
  app.add_option("--resume", v.resume, "continue the training from the checkpoint in this folder (--steps counts from "
                                       "the start of the training)")
      ->type_name("DIR");
  app.add_option("--clip-grad-norm", v.clip_grad_norm,
                 "before each Adam step, scale all gradients together so that their global norm is at most X "
                 "(0: no clipping)")
      ->type_name("X")
      ->capture_default_str();
  app.add_option("--micro-batches", v.micro_batches,
                 "split each step's batch into N micro-batches whose gradients are added in order: the bits of "
                 "--data-parallel on N ranks")
      ->type_name("N")
      ->capture_default_str();
  app.add_flag("--data-parallel", v.data_parallel,
               "train on this rank's share of each batch, gradients reduced across the ranks of mpirun -np N");
  app.add_option("--zero", v.zero, "with --data-parallel: ZeRO stage, 1 (all-reduce) or 2 (reduce-scatter)")
      ->capture_default_str();
  app.add_option("--bucket-kib", v.bucket_kib,
                 "with --data-parallel: reduce gradients in buckets of about this many KiB, each as soon as the "
                 "backward pass has produced it")
      ->type_name("KIB")
      ->capture_default_str();
  app.add_option("--comm-timeout", v.comm_timeout_s,
                 "with --data-parallel: seconds a rank waits for the others in a collective before it fails, naming "
                 "them (0: for ever); raise it where one rank may fall far behind, as in a long checkpoint save")
      ->type_name("SECONDS")
      ->capture_default_str();
  if (with_data) app.add_option("--data", v.data, "text file to train on (bytes are the tokens)")->capture_default_str();
}

example_options to_options(const flag_values& v) {
  example_options o;
  static_cast<session_config&>(o) = load_config(v.config);
  o.budget_ratio = v.budget_ratio;
  o.steps = v.steps;
  o.seed = v.seed;
  o.size = parse_preset(v.preset);
  o.prec = parse_precision(v.precision);
  o.data = v.data;
  o.save = v.save;
  o.save_every = v.save_every;
  o.resume = v.resume;
  o.clip_grad_norm = v.clip_grad_norm;
  o.micro_batches = v.micro_batches;
  o.data_parallel = v.data_parallel;
  o.zero = v.zero;
  if (v.bucket_kib > (std::uint64_t{1} << 30))
    throw config_error("--bucket-kib: " + std::to_string(v.bucket_kib) + " is not a bucket size; give 1 to 1073741824 KiB");
  o.bucket_bytes = v.bucket_kib * 1024;
  o.comm_timeout_s = v.comm_timeout_s;
  o.validate();
  check_outputs(v, o);
  return o;
}

}  // namespace spillway::examples
