// The training harness the examples share: opens a Session from example_options, runs the steps
// (setting the budget to a ratio of the footprint after the first, recording step, when asked),
// and collects losses and per-iteration reports. The examples' programs, the bench and the tests
// all call it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "examples/common/gradient_exchange.hpp"
#include "examples/common/options.hpp"
#include "offload/swap_policy.hpp"

namespace spillway::examples {

/// A model the harness trains. Made fresh for every Session (same options, same seed: same
/// initial weights and data).
class model {
 public:
  virtual ~model() = default;
  /// Registers the persistent tensors (parameters, gradients, optimizer state) with `s`.
  virtual void build(Session& s) = 0;
  /// Runs one training step's ops (forward, backward, optimizer) inside an iteration the
  /// harness opened, and returns the step's mean loss, read back with Session::read.
  /// `step` counts from 0 and picks the batch.
  virtual float train_step(Session& s, std::int64_t step) = 0;
  [[nodiscard]] virtual std::uint64_t parameter_count() const = 0;
  /// How the batch is shared out (ranks of a data-parallel job), when the model says.
  [[nodiscard]] virtual const batch_shares* shares() const { return nullptr; }
  /// A data-parallel job's gradient exchange counts so far (zeros otherwise).
  [[nodiscard]] virtual gradient_exchange::stats exchange_stats() const { return {}; }
  /// One line: the shape of the model and of a batch.
  [[nodiscard]] virtual std::string describe() const = 0;
};

using model_factory = std::function<std::unique_ptr<model>()>;

/// Everything a run measured. Byte counts and stall time are sums over the steps; peak device
/// bytes the worst step's.
struct run_result {
  std::string model;
  std::uint64_t parameters = 0;
  std::string backend;
  std::string policy;
  std::vector<float> losses;
  std::vector<iteration_report> iterations;
  std::uint64_t footprint_bytes = 0;     ///< peak live bytes with everything resident
  std::uint64_t min_budget_bytes = 0;    ///< Session::least_budget_bytes(): the largest single op's working set
  std::uint64_t device_budget_bytes = 0; ///< the budget in force
  std::uint64_t device_memory_bytes = 0; ///< what the device has
  std::uint64_t peak_device_bytes = 0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::uint64_t nvme_read_bytes = 0;
  std::uint64_t nvme_write_bytes = 0;
  std::uint64_t recomputes = 0;  ///< ops run again by the plan, over the steps (iteration_counters::recomputes)
  std::uint64_t host_ops = 0;    ///< ops the plan ran on the host, over the steps (iteration_counters::host_ops)
  std::uint64_t host_capable_ops = 0;  ///< ops of a recorded step with a host implementation (the Adam ops)
  std::uint64_t on_demand_fetches = 0;       ///< after the recording step
  std::uint64_t on_demand_evictions = 0;     ///< after the recording step
  std::uint64_t prefetches_deferred = 0;     ///< after the recording step
  std::uint64_t fragmented_allocations = 0;  ///< after the recording step
  double stall_ms = 0;
  gradient_exchange::stats exchange;  ///< --data-parallel: buckets reduced, and how many during the backward pass
  /// > 0: the budget is this fraction of the footprint, set after the first (recording) step,
  /// which ran at the options' budget (the device's free memory); 0: the budget never changed.
  double budget_ratio = 0;
  std::string chrome_trace;              ///< where the Chrome trace was written, if anywhere
  std::string chrome_trace_error;        ///< why the Chrome trace asked for could not be written
  /// 0-based index of this run's first step: 0, or the step a --resume checkpoint was saved after.
  /// `losses` and `iterations` are this run's, from that step on.
  int first_step = 0;
  std::string resumed_from;              ///< the --resume folder, if any
  std::string saved_to;                  ///< the --save folder, once a checkpoint was saved there
  int saved_after = 0;                   ///< steps done (from the start) at the last save

  /// Step times in ms, in order.
  [[nodiscard]] std::vector<double> step_ms() const;
  /// Median step time without the first (recording) iteration; the first's when it is alone.
  [[nodiscard]] double median_step_ms() const;
};

/// Called after every step with its 0-based index (counted from the start of the training, also
/// when resumed), loss and report.
using step_observer = std::function<void(int step, float loss, const iteration_report& report)>;
/// Called once the Session is open, before the first step (the footprint is known only after it,
/// and with a budget ratio so is the budget).
using start_observer = std::function<void(const run_result& so_far)>;

class drain_on_exit;

/// One training run, stepped by the caller: what train() does, a step at a time, so that runs
/// can be interleaved (the train bench alternates each setting with the everything-resident run
/// step by step, so both see the same machine load).
class training_run {
 public:
  /// Validates `o`, opens the Session (at the whole device when o.budget_ratio > 0) and builds the
  /// model; with o.resume, loads that checkpoint and goes on from its step. Throws config_error
  /// for bad options before any work.
  training_run(const example_options& o, const model_factory& make, const start_observer& on_start = {});
  ~training_run();
  training_run(const training_run&) = delete;
  training_run& operator=(const training_run&) = delete;

  /// Runs the next step and returns its loss. After the first step, with o.budget_ratio > 0, the
  /// Session (its device_budget_ratio) sets the device budget to ratio x footprint (a config_error
  /// when that is below the least any plan needs), so the following steps run under it. With
  /// o.save_every, saves a checkpoint into o.save after every that many steps (from the start).
  float step(const step_observer& on_step = {});
  /// Steps this run has done (not counting those before a resumed checkpoint).
  [[nodiscard]] int steps_done() const noexcept { return static_cast<int>(r_.losses.size()); }
  /// 0-based index of the next step, counted from the start of the training.
  [[nodiscard]] int next_step() const noexcept { return r_.first_step + steps_done(); }
  /// Saves a checkpoint into o.save unless the last step already saved one, then writes the
  /// Chrome trace if o.chrome_trace asks for one (a failure to write it is kept in
  /// run_result::chrome_trace_error, not thrown); the result of the steps run.
  run_result finish();
  [[nodiscard]] const run_result& result() const noexcept { return r_; }
  /// The Session the steps run in (tests look at its device between steps).
  [[nodiscard]] Session& session() noexcept { return *s_; }

 private:
  [[nodiscard]] std::uint64_t budget_above_footprint() const;  // o_.budget_ratio > 1: ratio x footprint
  void save_checkpoint();  // into o_.save, after next_step() steps
  [[nodiscard]] std::string checkpoint_folder(const std::string& dir) const;  // Note [Rank checkpoints]

  example_options o_;
  run_result r_;
  std::unique_ptr<Session> s_;
  std::unique_ptr<model> m_;
  std::unique_ptr<drain_on_exit> drain_;  // first to go: waits for queued work that reads the model
};

/// Trains a model made by `make` up to o.steps steps (from o.resume's checkpoint, when given, else
/// from the start), saving into o.save when given. With o.budget_ratio > 0 the first (recording)
/// step runs at the whole device and learns the footprint; the rest run at budget_ratio x
/// footprint (the Session's device_budget_ratio setting). Throws config_error for bad options before any work,
/// and for a ratio below the least any plan needs after the first step.
run_result train(const example_options& o, const model_factory& make, const step_observer& on_step = {},
                 const start_observer& on_start = {});


}  // namespace spillway::examples
