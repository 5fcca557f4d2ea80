// The training harness: the step loop (the Session sets the budget from a ratio of the
// footprint after the recording step), and the totals over the steps that the progress lines,
// the summary and the bench read.
#include "examples/common/trainer.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway::examples {

namespace {
bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
}  // namespace


std::vector<double> run_result::step_ms() const {
  std::vector<double> v;
  v.reserve(iterations.size());
  for (const auto& r : iterations) v.push_back(r.step_ms);
  return v;
}

double run_result::median_step_ms() const {
  auto v = step_ms();
  if (v.empty()) return 0;
  if (v.size() > 1) v.erase(v.begin());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Waits for the device's queued work when it leaves scope, so that a model never dies while
// its kernels and uploads still read its host buffers (an exception mid-step leaves work queued).
class drain_on_exit {
 public:
  explicit drain_on_exit(Session& s) : s_(s) {}
  ~drain_on_exit() {
    try {
      s_.device().synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the error already in flight is the one to report
    }
  }
  drain_on_exit(const drain_on_exit&) = delete;
  drain_on_exit& operator=(const drain_on_exit&) = delete;

 private:
  Session& s_;
};

training_run::training_run(const example_options& o, const model_factory& make, const start_observer& on_start) : o_(o) {
  o_.validate();
  // With a ratio, o_.device_budget is 0 (validate): the recording step runs at the whole device,
  // and the Session sets the budget to ratio x footprint after it (device_budget_ratio).
  s_ = std::make_unique<Session>(make_session_config(o_, o_.device_budget));
  m_ = make();
  drain_ = std::make_unique<drain_on_exit>(*s_);
  m_->build(*s_);
  if (!o_.resume.empty()) {  // validate() checked the seed and the step; load checks the tensors
    const std::string from = checkpoint_folder(o_.resume);
    if (from != o_.resume && !is_directory(from))
      throw config_error("--resume " + o_.resume + ": no checkpoint for rank " + std::to_string(m_->shares()->rank()) +
                         " of " + std::to_string(m_->shares()->ranks()) + " ranks (" + from +
                         "); resume a data-parallel job with as many ranks as saved it");
    const resume_point p = parse_meta(s_->load(from), "--resume " + o_.resume);
    r_.first_step = static_cast<int>(p.next_step);
    r_.resumed_from = o_.resume;
  }
  r_.model = m_->describe();
  r_.parameters = m_->parameter_count();
  r_.backend = to_string(s_->device().properties().backend);
  r_.policy = o_.policy;
  r_.budget_ratio = o_.budget_ratio > 0 ? o_.budget_ratio : o_.device_budget_ratio;
  r_.device_budget_bytes = s_->device_budget();
  r_.device_memory_bytes = s_->device().properties().total_memory;
  if (on_start) on_start(r_);
}

training_run::~training_run() = default;

float training_run::step(const step_observer& on_step) {
  const int step = next_step();
  s_->begin_iteration();
  const float loss = m_->train_step(*s_, step);
  const iteration_report rep = s_->end_iteration();
  r_.losses.push_back(loss);
  r_.iterations.push_back(rep);
  r_.peak_device_bytes = std::max(r_.peak_device_bytes, rep.peak_device_bytes);
  r_.h2d_bytes += rep.h2d_bytes;
  r_.d2h_bytes += rep.d2h_bytes;
  r_.nvme_read_bytes += rep.nvme_read_bytes;
  r_.nvme_write_bytes += rep.nvme_write_bytes;
  r_.recomputes += rep.recomputes;
  r_.host_ops += rep.host_ops;
  if (rep.planned) {  // the recording step runs on demand by design
    r_.on_demand_fetches += rep.on_demand_fetches;
    r_.on_demand_evictions += rep.on_demand_evictions;
    r_.prefetches_deferred += rep.prefetches_deferred;
    r_.fragmented_allocations += rep.fragmented_allocations;
  }
  r_.stall_ms += rep.stall_ms;
  r_.exchange = m_->exchange_stats();
  if (steps_done() == 1) {
    // With a ratio up to 1 the Session set the budget after this recording step itself
    // (device_budget_ratio); a ratio above 1 is the trainer's to apply.
    r_.footprint_bytes = s_->footprint_bytes();
    r_.min_budget_bytes = s_->least_budget_bytes();
    const auto& ops = s_->recorded_trace().ops;
    r_.host_capable_ops = static_cast<std::uint64_t>(
        std::count_if(ops.begin(), ops.end(), [](const op_desc& o) { return o.host_capable; }));
    if (o_.budget_ratio > 1) s_->set_device_budget(budget_above_footprint());
    r_.device_budget_bytes = s_->device_budget();
  }
  if (o_.save_every > 0 && next_step() % o_.save_every == 0) save_checkpoint();
  if (on_step) on_step(step, loss, rep);
  return loss;
}

std::string training_run::checkpoint_folder(const std::string& dir) const {
  const batch_shares* sh = m_->shares();
  return sh != nullptr && sh->comm ? rank_folder(dir, sh->rank(), sh->ranks()) : dir;
}

void training_run::save_checkpoint() {
  const std::string to = checkpoint_folder(o_.save);
  if (to != o_.save && ::mkdir(o_.save.c_str(), 0777) != 0 && errno != EEXIST) {
    const int err = errno;
    throw io_error("--save: cannot make the folder '" + o_.save + "': " + std::strerror(err), err);
  }
  s_->save(to, to_meta(resume_point_of(o_, next_step())));
  r_.saved_to = o_.save;
  r_.saved_after = next_step();
}

std::uint64_t training_run::budget_above_footprint() const {
  return static_cast<std::uint64_t>(std::llround(o_.budget_ratio * static_cast<double>(r_.footprint_bytes)));
}

run_result training_run::finish() {
  // The checkpoint first: it is the run's work, and a trace that cannot be written must not
  // lose it. That failure is kept in the result, so the program still writes its report.
  if (!o_.save.empty() && (r_.saved_to.empty() || r_.saved_after != next_step())) save_checkpoint();
  if (!o_.chrome_trace.empty()) {
    try {
      s_->write_chrome_trace(o_.chrome_trace);
      r_.chrome_trace = o_.chrome_trace;
    } catch (const io_error& e) {
      r_.chrome_trace_error = e.what();
    }
  }
  return r_;
}

run_result train(const example_options& o, const model_factory& make, const step_observer& on_step,
                 const start_observer& on_start) {
  training_run run(o, make, on_start);
  while (run.next_step() < o.steps) run.step(on_step);
  return run.finish();
}

}  // namespace spillway::examples
