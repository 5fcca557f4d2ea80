// Example options: preset names, validation (the Session's settings by session_config, the
// example's own here) and the session_config a run opens its Session with.
#include "examples/common/options.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/checkpoint.hpp"

namespace spillway::examples {

const char* to_string(preset p) noexcept {
  switch (p) {
    case preset::tiny: return "tiny";
    case preset::small: return "small";
    case preset::medium: return "medium";
    case preset::large: return "large";
  }
  return "?";
}

preset parse_preset(const std::string& text) {
  if (text == "tiny") return preset::tiny;
  if (text == "small" || text == "default") return preset::small;
  if (text == "medium") return preset::medium;
  if (text == "large") return preset::large;
  throw config_error("--preset: '" + text + "' is not a preset (tiny, small, medium, large)");
}

namespace {

bool is_folder(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// The rank-0 folder of a data-parallel checkpoint in `dir` ("rank-0-of-N"), or "" when none.
std::string first_rank_folder(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return "";
  std::string found;
  while (const dirent* e = ::readdir(d)) {
    const std::string name(e->d_name);
    if (name.starts_with("rank-0-of-") && is_folder(dir + "/" + name)) found = dir + "/" + name;
  }
  ::closedir(d);
  return found;
}

/// --save, --save-every and --resume, checked before any work (Session::save makes a missing
/// folder whose parent exists).
void check_checkpoint_folders(const example_options& o) {
  if (o.save_every < 0)
    throw config_error("--save-every: " + std::to_string(o.save_every) + " is not a number of steps; give 1 or more");
  if (o.save_every > 0 && o.save.empty())
    throw config_error("--save-every " + std::to_string(o.save_every) + " without --save: give the folder to save into");
  if (!o.save.empty()) {
    struct stat st {};
    if (::stat(o.save.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) throw config_error("--save: '" + o.save + "' is a file; give a folder");
      if (const auto why = cannot_write_in(o.save); !why.empty())
        throw config_error("--save: the folder '" + o.save + "' is not writable (" + why + "); give a folder this run can write");
    } else {
      std::string parent = o.save;
      while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
      const auto slash = parent.rfind('/');
      parent = slash == std::string::npos ? "." : slash == 0 ? "/" : parent.substr(0, slash);
      if (!is_folder(parent))
        throw config_error("--save: cannot make the folder '" + o.save + "': '" + parent + "' is not a folder");
      if (const auto why = cannot_write_in(parent); !why.empty())
        throw config_error("--save: cannot make the folder '" + o.save + "': '" + parent + "' is not writable (" + why +
                           "); give a folder this run can write");
    }
  }
  if (!o.resume.empty()) {
    if (!is_folder(o.resume)) throw config_error("--resume: '" + o.resume + "' is not a folder");
    // A data-parallel job's ranks save into rank folders (Note [Rank checkpoints]); their metas agree.
    const std::string ranked = first_rank_folder(o.resume);
    if (o.data_parallel && ranked.empty())
      throw config_error("--resume " + o.resume + " with --data-parallel: the folder holds no checkpoint of a data-parallel "
                         "job (its ranks save into rank-R-of-N folders); give a folder that a --data-parallel run saved "
                         "into, or drop --data-parallel");
    if (!o.data_parallel && !ranked.empty())
      throw config_error("--resume " + o.resume + ": the folder holds a checkpoint of a data-parallel job (" +
                         ranked.substr(ranked.rfind('/') + 1) + "); resume it with --data-parallel under mpirun with "
                         "as many ranks");
    const checkpoint::reader r(o.data_parallel ? ranked : o.resume);  // config_error or corruption_error naming the file
    const resume_point p = parse_meta(r.meta(), "--resume " + o.resume);
    if (p.seed != o.seed)
      throw config_error("--resume " + o.resume + ": the checkpoint is of a run with --seed " + std::to_string(p.seed) +
                         ", this run has --seed " + std::to_string(o.seed) + "; give --seed " + std::to_string(p.seed));
    // The model the checkpoint holds: a run of another shape would fail at the load, naming a
    // tensor's size; say which setting differs instead.
    const resume_point here = resume_point_of(o, 0);
    for (const auto& [flag, saved, now] : {std::tuple{"--preset", p.preset, here.preset},
                                           std::tuple{"--precision", p.precision, here.precision},
                                           std::tuple{"--micro-batches", p.micro_batches == 0 ? std::string() : std::to_string(p.micro_batches),
                                                      std::to_string(here.micro_batches)}})
      if (!saved.empty() && saved != now)
        throw config_error("--resume " + o.resume + ": the checkpoint is of a run with " + flag + " " + saved +
                           ", this run has " + flag + " " + now + "; give " + flag + " " + saved);
    if (p.next_step >= o.steps)
      throw config_error("--resume " + o.resume + ": the checkpoint is after step " + std::to_string(p.next_step) +
                         " and --steps is " + std::to_string(o.steps) + ", which leaves nothing to run; give --steps above " +
                         std::to_string(p.next_step) + " (--steps counts from the start of the training)");
  }
}

/// --clip-grad-norm: 0 (off) or a positive norm that a float holds (the kernels take a float).
void check_clip_grad_norm(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%g", v);
  if (!(v >= 0) || !std::isfinite(v))
    throw config_error(std::string("--clip-grad-norm: ") + text +
                       " is not a norm; give a positive number, or 0 for no clipping");
  const auto f = static_cast<float>(v);
  if (v > 0 && !(f > 0 && std::isfinite(f)))
    throw config_error(std::string("--clip-grad-norm: ") + text +
                       " is beyond what a float holds; give a number from 1e-38 to 3e38, or 0 for no clipping");
}

}  // namespace

std::string cannot_write_in(const std::string& dir) {
  const std::string probe = dir + "/.spillway-write-check-" + std::to_string(::getpid());
  if (::mkdir(probe.c_str(), 0700) == 0) {
    ::rmdir(probe.c_str());
    return {};
  }
  // One already there was left by an earlier process with this id, which could make it.
  return errno == EEXIST ? std::string() : std::strerror(errno);
}

resume_point resume_point_of(const example_options& o, std::int64_t next_step) {
  return {next_step, o.seed, to_string(o.size), to_string(o.prec), o.micro_batches};
}

std::string to_meta(const resume_point& p) {
  std::string meta = "spillway-example 1\nnext_step " + std::to_string(p.next_step) + "\nseed " + std::to_string(p.seed) + "\n";
  if (!p.preset.empty()) meta += "preset " + p.preset + "\n";
  if (!p.precision.empty()) meta += "precision " + p.precision + "\n";
  if (p.micro_batches > 0) meta += "micro_batches " + std::to_string(p.micro_batches) + "\n";
  return meta;
}

resume_point parse_meta(const std::string& meta, const std::string& where) {
  std::istringstream in(meta);
  std::string word;
  int version = 0;
  resume_point p;
  p.next_step = -1;
  bool seed = false;
  if (!(in >> word >> version) || word != "spillway-example" || version != 1)
    throw config_error(where + ": the checkpoint was not saved by an example program (its meta does not start with "
                       "\"spillway-example 1\")");
  while (in >> word) {
    if (word == "next_step" && in >> p.next_step) continue;
    if (word == "seed" && in >> p.seed) {
      seed = true;
      continue;
    }
    if (word == "preset" && in >> p.preset) continue;
    if (word == "precision" && in >> p.precision) continue;
    if (word == "micro_batches" && in >> p.micro_batches && p.micro_batches > 0) continue;
    throw config_error(where + ": the checkpoint's meta has '" + word +
                       "' where a step, a seed, a preset, a precision or a micro-batch count should be");
  }
  if (p.next_step < 0 || !seed) throw config_error(where + ": the checkpoint's meta lacks its step or its seed");
  return p;
}

void example_options::validate() const {
  session_config::validate();
  if (steps < 1) throw config_error("--steps: " + std::to_string(steps) + " is not a positive number of steps");
  if (!(budget_ratio >= 0) || budget_ratio > 1e6)
    throw config_error("--budget-ratio: " + format_real(budget_ratio) +
                       " is not a ratio of the footprint; give one above 0 (such as 0.25; 0 sets no budget) and at most 1e6");
  if (budget_ratio > 0 && device_budget > 0)
    throw config_error("--budget-ratio and " + source_of("device_budget") + " both set the device budget; give one");
  if (budget_ratio > 0 && device_budget_ratio > 0)
    throw config_error("--budget-ratio and " + source_of("device_budget_ratio") + " both set the device budget; give one");
  check_clip_grad_norm(clip_grad_norm);
  if (micro_batches < 1 || micro_batches > 4096)
    throw config_error("--micro-batches: " + std::to_string(micro_batches) + " is not a count of micro-batches from 1 to 4096");
  if (zero != 1 && zero != 2) throw config_error("--zero: " + std::to_string(zero) + " is not a ZeRO stage; give 1 or 2");
  if (bucket_bytes < 1024 || bucket_bytes > (std::uint64_t{1} << 40))
    throw config_error("--bucket-kib: " + std::to_string(bucket_bytes / 1024) +
                       " KiB is not a bucket size; give 1 to 1073741824 KiB (1 KiB to 1 TiB)");
  if (!(comm_timeout_s >= 0) || comm_timeout_s > 1e7)
    throw config_error("--comm-timeout: " + format_real(comm_timeout_s) +
                       " is not a number of seconds; give one from 0 (wait for ever) to 1e7");
  if (data_parallel && micro_batches > 1)
    throw config_error("--micro-batches and --data-parallel together: a rank trains on one micro-batch of each step; "
                       "give --micro-batches N alone for one process, or --data-parallel under mpirun -np N");
  if ((data_parallel || micro_batches > 1) && clip_grad_norm > 0)
    throw config_error("--clip-grad-norm with --micro-batches or --data-parallel: clipping over sharded gradients is not "
                       "supported yet; give --clip-grad-norm 0");
  check_checkpoint_folders(*this);
}

std::string rank_folder(const std::string& dir, int rank, int ranks) {
  return dir + "/rank-" + std::to_string(rank) + "-of-" + std::to_string(ranks);
}

session_config make_session_config(const example_options& o, std::uint64_t device_budget) {
  session_config c = o;  // the Session's part; chrome_trace: the Session records a timeline only when set
  c.device_budget = device_budget;
  // --budget-ratio is the Session's device_budget_ratio, named by the example's flag in messages.
  // Above 1 (a budget with room beyond the footprint, which the train bench gives the
  // everything-resident run on a GPU) the trainer sets the budget itself.
  if (o.budget_ratio > 0 && o.budget_ratio <= 1) {
    char text[40];
    std::snprintf(text, sizeof text, "%.17g", o.budget_ratio);
    c.set("device_budget_ratio", text, "--budget-ratio");
  }
  return c;
}

}  // namespace spillway::examples
