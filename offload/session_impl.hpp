// The Session's inside, shared by the files that implement it (session.cpp, session_views.cpp,
// session_checkpoint.cpp). Not installed: users include offload/swap_policy.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "allocator/device_budget.hpp"
#include "allocator/device_resource.hpp"
#include "allocator/pinned_host_pool.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/fit_plan.hpp"
#include "offload/session_hooks.hpp"
#include "offload/session_trace.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/planner_host.hpp"
#include "offload/profile.hpp"
#include "offload/simulator.hpp"
#include "offload/swap_policy.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"
#include "swap/host_tier.hpp"
#include "swap/nvme_speed.hpp"
#include "swap/nvme_tier.hpp"

namespace spillway {

namespace session_detail {
/// Where the NVMe tier starts when nvme.reserve is 0 (Note [Sizing the NVMe tier] in session.cpp).
constexpr std::uint64_t initial_nvme_reserve = std::uint64_t{16} << 20;
/// Bytes the plan may keep on the NVMe tier at once, as the tier with options `o` stores them.
std::uint64_t nvme_bytes_of(const plan& p, const trace& t, const nvme_options& o);
/// config_error when plan `p` keeps more in the host tier at once than host_budget (Note [Sizing
/// the host tier] in session.cpp); `hw` as the plan was made for.
void check_host_tier(const trace& t, const offload::lifetime_report& r, const plan& p, const offload::hw_profile& hw,
                     const session_config& cfg, bool have_nvme);
/// The phase of an op from its name (forward/fwd, backward/bwd/grad, adam/sgd/optim/step).
op_phase phase_from_name(std::string_view name);
std::string planner_name(const session_config& c);
/// Copy bandwidth of the device's link, measured once with pinned memory (32 MiB each way).
std::pair<double, double> measure_link(Device& dev);

// Note [Phases]
// A loop may run iterations of several kinds: training steps, evaluation passes, a step with
// another batch size. Each kind is a phase, named by the tag given to begin_iteration, and each
// phase keeps its own recorded trace, plan and layout, so that alternating phases follow their
// plans instead of recording again at every switch. An iteration follows the plan of its
// phase while its ops match that trace (name, reads, writes), and falls back to on-demand moves
// from the first op that does not; the executor keeps every transient until release() (Note
// [Transients live until release] in prefetch/executor.cpp), so the fallback always finds the
// values it needs. A phase's iteration that departed is recorded and planned again, so a phase
// is recorded once per change of its own ops, never because another phase ran in between.
//
// A host read (Session::read inside an iteration) is an op of the trace, "host read: NAME",
// that reads the tensor: the planner sees it as a use and keeps the value, or brings it back,
// for the read.

// Note [Shapes]
// A loop's iterations may change shape within a phase: the last batch of an epoch is smaller,
// sequences come in a few lengths. A transient added again at a size it had before gets the id
// it had then (add_tensor), so the iteration's trace is the one recorded for that shape, and the
// tensors the Session keeps stay one per name and shape, however often the shapes alternate (an
// id added already in this iteration, whose value may be in use, is not taken again: a loop
// that adds one name at two sizes in turn within an iteration gets one id per turn, the same
// ones every iteration).
// Each phase keeps the plans of its last shapes_kept shapes besides the one it follows: an
// iteration that departs from the plan runs on demand as before, and at its end, when its trace
// is one of those (the same ops, reading and writing the same tensors), the phase takes that
// plan back instead of planning again; otherwise the plan it followed joins the kept ones (the
// oldest leaves) and the new trace is planned. A new budget drops the kept plans: they were
// made for the old one.
inline constexpr std::size_t shapes_kept = 8;

// Note [Shape churn]
// Where nearly every step brings sizes its phase has not planned (sequences of any length,
// unpadded; tokens routed to experts), planning each new shape costs more than its plan saves:
// the step after it is another new shape, which departs at its first op of a new size and runs on
// demand anyway. So once a phase has planned churn_streak new shapes in a row (no step between
// them followed its plan to the end), it plans only every churn_every-th new shape after that;
// the others run on demand, and the phase keeps the plan it follows. Kept plans are still taken
// back. A step that follows its plan to the end ends the streak. Sizes from a few buckets (Note
// [Shapes]) meet no new shape once each is planned; under their own tags every step follows a plan.
inline constexpr int churn_streak = 4;
inline constexpr int churn_every = 8;
struct shape_churn {
  int planned_in_a_row = 0;  // new shapes planned since the streak began
  int skipped = 0;           // new shapes not planned since the last one that was
};

/// One phase's recording and plan (Note [Phases]).
struct phase_state {
  trace recorded;      // the trace its plan was made from
  plan p;
  device_layout layout;
  bool have_plan = false;
  std::uint64_t footprint = 0;  // peak live bytes of `recorded` with everything resident
  std::uint64_t least = 0;      // its largest single op's working set, placed
  std::vector<std::uint64_t> gather;  // per op of `recorded`: gather scratch bytes (Note [Views])
  std::uint64_t scratch = 0;    // the most scratch one op held beside its tensors, placed (Note [Headroom])
  int margin_doublings = device_budget::no_margin;  // of the packing margin the plan was made with (Note [Headroom])
  double predicted_ms = 0;      // the simulator's step time for p on the measured hardware (0: unknown)
  bool retime = false;          // its next planned iteration times its ops (Note [Timing the plan's ops])
};
}  // namespace session_detail

using namespace session_detail;  // NOLINT(google-build-using-namespace): internal header

class session_impl {
 public:
  session_impl(session_config c, const session_hooks& hooks) : cfg(std::move(c)) {
    cfg.validate();
    device_options o;
    o.cpu_device_memory = cfg.cpu_device_memory;
    o.strict.callback_seed = cfg.cpu_callback_seed;
    o.debug_host_access = cfg.cpu_debug_host_access;
    o.h2d_bytes_per_second = cfg.link_gbps * 1e9;
    o.d2h_bytes_per_second = cfg.link_gbps * 1e9;
    dev = make_device(cfg.backend, o);
    if (hooks.wrap_device) dev = hooks.wrap_device(std::move(dev));
    stage_host_runs = hooks.stage_host_runs;
    edit_plan = hooks.edit_plan;
    // The config's budget, or the device's free memory (Note [Headroom] in device_budget.hpp).
    const auto budget = cfg.device_budget != 0 ? device_budget(cfg.device_budget) : device_budget::of_free_memory(*dev);
    budget.check_fits(*dev);
    executor_stack_options so;
    so.device_budget = budget.bytes();
    so.host_budget = cfg.host_budget;
    so.timeline = !cfg.chrome_trace.empty();
    if (!cfg.nvme.directories.empty()) {
      nvme_options no;  // Note [Sizing the NVMe tier]
      no.directories = cfg.nvme.directories;
      no.reserve = cfg.nvme.reserve != 0 ? cfg.nvme.reserve : initial_nvme_reserve;
      no.grow_on_demand = cfg.nvme.reserve == 0;
      no.block_size = static_cast<std::uint32_t>(cfg.nvme.block_size);
      no.queue_depth = static_cast<unsigned>(cfg.nvme.queue_depth);
      no.rings = static_cast<unsigned>(cfg.nvme.rings);
      no.io_timeout = std::chrono::milliseconds(cfg.nvme.io_timeout_ms);
      if (hooks.make_io_queue) no.make_queue = hooks.make_io_queue;
      so.nvme = no;
    }
    stack = std::make_unique<executor_stack>(*dev, so);
    exec = &stack->exec();
    exec->set_rerun([this](op_index o) { rerun(o); });
    if (cfg.link_gbps > 0) {
      link = {cfg.link_gbps * 1e9, cfg.link_gbps * 1e9};
    } else {
      link = measure_link(*dev);
    }
    // The NVMe tier's rates, measured through its own files (16 MiB each way), unless a test
    // replaced its I/O queue (the seam injects faults, which a measurement would consume).
    if (stack->nvme() != nullptr && !hooks.make_io_queue) {
      const nvme_speed s = measure_speed(*stack->nvme(), stack->pool());
      if (s.bytes > 0) nvme_rates = {s.read_bytes_per_s, s.write_bytes_per_s};
    }
  }

  ~session_impl() {
    if (host_staging != nullptr) {
      try {
        dev->synchronize();
        dev->deallocate_pinned(host_staging, host_staging_bytes);
      } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
      }
    }
    if (!cfg.chrome_trace.empty()) {
      try {
        write_chrome_trace(cfg.chrome_trace);
      } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
      }
    }
  }

  tensor_id add_tensor(std::string name, std::uint64_t bytes, tensor_kind kind) {
    if (bytes == 0) throw config_error("tensor \"" + name + "\" has 0 bytes; give it at least 1");
    if (bytes > max_size_bytes)
      throw config_error("tensor \"" + name + "\" has " + std::to_string(bytes) + " bytes; at most 1 PiB is possible");
    auto it = by_name.find(name);
    if (it != by_name.end()) {
      auto& d = tensors[it->second];
      // One name, one persistent tensor: a second add of the name would share the first's
      // memory and overwrite its value (two layers both called "weight", or a get-or-create
      // call each step that zeroed the optimizer state every time), so it is refused.
      if (is_persistent(kind) || is_persistent(d.kind)) {
        const std::string first = format_bytes(d.bytes) + " " + std::string(to_string(d.kind));
        const std::string second = format_bytes(bytes) + " " + std::string(to_string(kind));
        throw config_error("persistent tensor \"" + name + "\" registered twice (" + first + ", then " + second +
                           "); give each tensor its own name" +
                           (first == second ? ", or keep the handle the first add returned: a second one would "
                                              "share its memory and overwrite its value"
                                            : ""));
      }
      // A transient added again after its release() in this iteration (a loop over
      // micro-batches) starts a new value in the same tensor. Its first add in an iteration
      // takes the first id of its shape below, so every iteration names the same ids in turn.
      // Added again while its value is live (a loop that names every layer's output "hidden"
      // and releases them after the backward pass), it is another tensor of the same name: one
      // more id of its shape below, so neither value overwrites the other.
      if (d.bytes == bytes && d.kind == kind && added.contains(it->second) && !live.contains(it->second)) {
        exec->define(it->second, d);
        live.insert(it->second);
        return it->second;
      }
    }
    std::vector<tensor_id>* same_shape = nullptr;
    if (!is_persistent(kind)) {  // a shape this transient had before (Note [Shapes])
      same_shape = &shape_ids[shape_key{name, bytes, kind}];
      for (const tensor_id before : *same_shape) {
        if (added.contains(before)) continue;  // its value may still be in use in this iteration
        by_name[name] = before;
        added.insert(before);
        live.insert(before);
        exec->define(before, tensors[before]);
        return before;
      }
    }
    const auto id = static_cast<tensor_id>(tensors.size());
    tensors.push_back(tensor_desc{name, bytes, kind});
    by_name[name] = id;
    if (same_shape != nullptr) {
      same_shape->push_back(id);
      added.insert(id);
      live.insert(id);
    }
    exec->define(id, tensors.back());
    return id;
  }

  /// Undoes add_tensor of a persistent tensor, the last one added, whose first value found no
  /// room (Session::add_persistent).
  void forget_tensor(tensor_id id) {
    if (id + 1 != tensors.size()) return;
    exec->forget(id);
    by_name.erase(tensors[id].name);
    tensors.pop_back();
  }

  void check_handle(tensor_handle t) const {
    SPILLWAY_EXPECTS_T(usage_error, t.id < tensors.size(), "unknown tensor handle " + std::to_string(t.id));
  }

  // Note [Failed iterations]
  // A loop that catches an error from a step (a kernel that failed, a drive that did not answer,
  // memory the device would not give, its own code's exception) and goes on to the next step
  // does not call end_iteration for the failed one. Each call that reaches the device inside an
  // iteration notes an error leaving it (note_failure), and so does an op's scope that an
  // exception leaves: the iteration has failed. begin_iteration then ends a failed iteration
  // first, quietly, and plans nothing from it; so does end_iteration when the loop calls it, and
  // each call made between iterations (save, load, set_device_budget). The
  // executor's op, if the error left one open, is abandoned (Note [Abandoned ops] in
  // prefetch/executor_failures.cpp). A device that failed for good reports its error again at
  // the next step's first use of it; one that failed once runs the next step. An exception of
  // the loop's own between ops passes no Session code: a loop that skips such a step calls
  // abandon_iteration. A usage_error is a mistake in the loop, not a failed step: it leaves the
  // iteration as it was, and an iteration not ended is reported; but one that leaves an op's
  // scope fails the step, as any exception does there (the scope cannot tell them apart).

  /// Inside a catch handler of a call that reaches the device: an error other than a usage_error
  /// marks the iteration failed (Note [Failed iterations]).
  void note_failure() noexcept {
    try {
      throw;
    } catch (const usage_error&) {  // NOLINT(bugprone-empty-catch): the loop's mistake, not a failed step
    } catch (...) {
      if (in_iteration) iteration_failed = true;
    }
  }

  /// Ends a failed iteration (Note [Failed iterations]) without a report.
  void end_failed_iteration() noexcept {
    forget_sums();
    in_iteration = false;
    iteration_failed = false;
    op_open = false;
    open_on_host = false;
    bodies.clear();
    following = false;
    try {
      exec->abandon_op();  // an op whose scope the error left, if any (Note [Abandoned ops])
    } catch (...) {  // NOLINT(bugprone-empty-catch): the failure was reported when it happened
    }
    try {
      (void)exec->end_iteration();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the failure was reported when it happened
    }
  }

  /// A call made between iterations ends a failed one first (Note [Failed iterations]).
  void end_failed_step() noexcept {
    if (in_iteration && iteration_failed) end_failed_iteration();
  }

  void begin_iteration(std::string_view tag) {
    end_failed_step();
    if (ratio_refused) std::rethrow_exception(ratio_refused);
    SPILLWAY_EXPECTS_T(usage_error, !in_iteration || !op_open,
                       "begin_iteration() while op \"" + (ops.empty() ? std::string() : ops.back().name) +
                           "\" of the last iteration is still open: end its scope (the op_scope object going out "
                           "of scope) before end_iteration()");
    SPILLWAY_EXPECTS_T(usage_error, !in_iteration,
                       "begin_iteration() called twice without end_iteration(); a loop that gives up a step part "
                       "way, on an exception of its own, ends it with abandon_iteration()");
    finalize_views();
    auto it = phases.find(tag);
    if (it == phases.end()) it = phases.emplace(std::string(tag), phase_state{}).first;
    if (&it->second != active) {  // another phase: the executor follows its plan, or records
      active = &it->second;
      if (active->have_plan) {
        exec->follow(&active->recorded, &active->p, &active->layout);
      } else {
        exec->follow(nullptr, nullptr);
      }
    }
    in_iteration = true;
    following = active->have_plan;
    exec->set_timing(!active->have_plan || active->retime);
    try {
      exec->begin_iteration();
    } catch (...) {
      note_failure();  // the device refused the iteration's first marks: a failed step
      throw;
    }
    ops.clear();
    bodies.clear();
    plan_rerun_checks();
    touched.clear();
    added.clear();
    live.clear();
    last_metrics.clear();
    op_gather.clear();
    iteration_start = std::chrono::steady_clock::now();
  }

  // ---- ops and host reads (session_ops.cpp) ----
  /// Opens op `name`: expands parents into their pieces (Note [Views]), zero-fills first
  /// accumulations (Note [Accumulation]), makes the tensors resident and gathers named parents.
  std::uint32_t open_op(std::string_view name, std::span<const tensor_handle> reads,
                        std::span<const tensor_handle> writes, std::span<const tensor_handle> accumulates,
                        double flops, op_phase phase, bool recomputable = false, double host_bytes = -1);
  /// Note [Sums no op read]: refuses a read of a sum whose earlier iterations' part a zero-fill
  /// discarded, before any work, then notes what op `name` consumes, zeroes, overwrites and adds into.
  void check_sums(const std::string& name, std::span<const tensor_id> consumed, std::span<const tensor_id> zeroed,
                  std::span<const tensor_id> overwritten, std::span<const tensor_id> summed);
  /// Note [Metrics after the step]: keeps the values of the iteration's unreleased metrics.
  void keep_metrics();
  /// False for a tensor that holds no value: a gradient dropped after its last use, a transient
  /// released or that no op wrote.
  bool holds_value(tensor_id id) {
    try {
      exec->check_readable(id);
      return true;
    } catch (const usage_error&) {
      return false;
    }
  }
  /// A failed step's sums are given up with it: the next step's zero-fill loses nothing wanted.
  /// A tensor just added whose name a loaded checkpoint holds as optimizer state not yet added:
  /// its value from there (Note [State added after load] in session_checkpoint.cpp).
  void take_awaited_value(tensor_id id);
  void forget_sums() noexcept {
    unread_sums.clear();
    lost_sums.clear();
    lossy_reads.clear();
  }
  /// Session::recomputable_op's checks, before any work (Note [Recomputable ops] in session_ops.cpp).
  void check_recomputable(const std::string& name, std::span<const tensor_handle> reads,
                          std::span<const tensor_handle> writes) const;
  /// The executor's rerun callback: runs op o's body again (Note [Recomputable ops]).
  void rerun(op_index o);
  /// Note [Checking reruns] (session_rerun_check.cpp): which ops the followed plan reruns, at
  /// begin_iteration; the checksums of what op k wrote in its first run; a rerun's against them.
  void plan_rerun_checks();
  void note_first_run(op_index k);
  void check_rerun(op_index o);
  /// Scatters what the op wrote into named parents back to their pieces, then ends the op.
  void end_op(std::uint32_t k);
  /// The device pointer of a tensor the open op named (a parent's: its gathered copy).
  [[nodiscard]] void* op_ptr(tensor_handle t) const;
  /// Session::read: inside an iteration, an op of the trace that reads the tensor (Note [Phases]).
  void read(tensor_handle t, void* host);
  /// Session::host_capable_op (session_host_ops.cpp): its checks before any work, and its host
  /// body run over the host-tier copies when the plan places op k on the host.
  void check_host_capable(const std::string& name, std::span<const tensor_handle> reads,
                          std::span<const tensor_handle> writes) const;
  void run_host_body(std::uint32_t k, const Session::host_body& body);
  /// Host memory bandwidth for the planner's host-op estimates, measured once when first needed.
  double host_memory_rate();
  /// Session::op_scope::run (session_host_run.cpp).
  void run_on_host(const std::function<void(const Session::op_scope::host_access&)>& f,
                   const Session::op_scope::host_access& access, std::vector<std::pair<tensor_id, void*>>& ptrs);

  // ---- views (session_views.cpp) ----
  tensor_handle add_view(tensor_handle parent, std::uint64_t offset, std::uint64_t bytes, std::string name);
  /// Splits every parent whose views are not yet in force into its pieces (once, before the
  /// parent's first use).
  void finalize_views();
  [[nodiscard]] bool is_split(tensor_id id) const { return splits.contains(id) && splits.at(id).finalized; }
  /// The ids holding tensor `id`'s bytes: its pieces for a split parent, else itself.
  [[nodiscard]] std::vector<tensor_id> pieces_of(tensor_id id) const;
  /// The persistent tensors whose bytes the executor holds (a split parent's pieces, not the
  /// parent), in id order: what a checkpoint saves. Puts pending views in force first.
  [[nodiscard]] std::vector<tensor_id> checkpoint_ids();

  /// Whether op `a` of a recorded trace is op `b` of this iteration (Note [Phases]).
  static bool same_op(const op_desc& a, const op_desc& b) {
    return a.name == b.name && a.reads == b.reads && a.writes == b.writes && a.recomputable == b.recomputable &&
           a.host_capable == b.host_capable;
  }
  bool matches(op_index k, const op_desc& d) const {
    const trace& planned = active->recorded;
    return k < planned.ops.size() && same_op(planned.ops[k], d);
  }

  /// Session::set_device_budget: checked first, so a refused budget changes nothing.
  void set_device_budget(std::uint64_t bytes);

  /// The least budget over every recorded phase: each phase's plan must fit it.
  std::uint64_t least_of_all() const {
    std::uint64_t least = 0;
    for (const auto& [tag, ph] : phases) least = std::max(least, ph.least);
    return least;
  }

  /// The device_budget_ratio setting, after the first recording: budget = ratio x footprint. A
  /// ratio that gives no budget this Session can use (below the least any plan needs, above the
  /// device, more than the device can give now) refuses every later step the same way
  /// (begin_iteration), so a loop that catches a step's error and goes on does not train on at a
  /// budget it did not ask for; set_device_budget lifts it.
  void apply_budget_ratio() {
    ratio_applied = true;
    const double ratio = cfg.device_budget_ratio;
    const std::uint64_t footprint = active->footprint;
    const auto bytes = static_cast<std::uint64_t>(std::llround(ratio * static_cast<double>(footprint)));
    const std::uint64_t least = least_of_all();
    const std::uint64_t total = dev->properties().total_memory;
    // The ratio's bound, rounded to four places toward the ratios that work.
    const auto refuse = [&](const std::string& why, double bound, bool least_ratio) {
      const double rounded = least_ratio ? std::ceil(bound * 1e4) / 1e4 : std::floor(bound * 1e4) / 1e4;
      const char* which = least_ratio ? "at least" : "at most";
      ratio_refused = std::make_exception_ptr(
          config_error(cfg.source_of("device_budget_ratio") + ": " + format_real(ratio) + " gives a device budget of " +
                       format_bytes(bytes) + " (of a " + format_bytes(footprint) + " footprint), " + why +
                       "; give a ratio of " + which + " " + format_real(rounded) +
                       ", or a budget with set_device_budget"));
      std::rethrow_exception(ratio_refused);
    };
    if (bytes < least)
      refuse("below the least any plan needs: " + format_bytes(least) + " (the largest single op's working set)",
             static_cast<double>(least) / static_cast<double>(footprint), true);
    if (bytes > total)
      refuse("more than the device's " + format_bytes(total) + " (" + dev->properties().name + ")",
             static_cast<double>(total) / static_cast<double>(footprint), false);
    try {
      set_device_budget(bytes);
    } catch (const out_of_memory&) {  // memory others hold on a GPU: the old budget stays
      ratio_refused = std::current_exception();
      throw;
    }
  }

  iteration_report end_iteration() {
    SPILLWAY_EXPECTS_T(usage_error, in_iteration, "end_iteration() without begin_iteration()");
    const bool failed = std::exchange(iteration_failed, false);
    if (failed) forget_sums();
    if (failed && op_open) {  // an op whose scope an exception left (Note [Failed iterations])
      op_open = false;
      open_on_host = false;
      open_named.clear();
      try {
        exec->abandon_op();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the op is closed; ending the iteration reports the device
      }
    }
    SPILLWAY_EXPECTS_T(usage_error, !op_open, "end_iteration() inside an op's scope");
    in_iteration = false;
    bodies.clear();  // they may capture this iteration's references
    if (following && (failed || ops.size() != active->recorded.ops.size())) following = false;
    const bool followed = following;
    iteration_report r;
    r.iteration = history.size() + 1;
    r.planned = followed;
    r.policy = followed ? active->p.policy : "on-demand";
    r.planned_step_ms = followed ? active->predicted_ms : 0;
    std::exception_ptr io_failure;
    executor_stats st;
    if (!failed) keep_metrics();
    try {
      st = exec->end_iteration();
    } catch (const io_error&) {
      io_failure = std::current_exception();  // report after the bookkeeping: nothing is lost
    }
    if (!failed && !io_failure) ++iterations_ended;  // Note [Op seeds] in session.cpp
    r.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - iteration_start).count();
    static_cast<iteration_counters&>(r) = st;  // every counter, as the executor counted it
    for (auto& [name, ms] : st.stalls) r.stalls.push_back(stall_record{name, ms});
    history.push_back(r);
    if (!followed && !io_failure && !failed) {
      replan(st);
      if (cfg.device_budget_ratio > 0 && !ratio_applied) apply_budget_ratio();
    } else if (followed) {
      churn[active] = shape_churn{};  // it followed its plan to the end (Note [Shape churn])
      active->scratch = std::max(active->scratch, st.op_scratch_peak_bytes);
      // The plan did not fit in practice (packing and rounding took more than the margin left
      // for them): plan the same trace again with the margin doubled (Note [Headroom]). And the
      // first planned iteration's op times (Note [Timing the plan's ops]).
      const bool wider = r.on_demand_evictions > 0 && active->margin_doublings < device_budget::max_margin_doublings;
      std::optional<phase_state> before;
      if ((active->retime && !io_failure) || wider) before = *active;
      const bool retimed = active->retime && !io_failure && take_op_times(active->recorded, st.op_ms);
      active->retime = false;
      if (before) before->retime = false;
      if (wider) ++active->margin_doublings;
      if (wider || retimed) {
        try {
          plan_trace(*active, active->recorded);
        } catch (const config_error&) {
          // The new times or the wider margin gave a plan this Session cannot hold (more of the
          // host or NVMe tier than it has): the plan it runs now stays, as if the times had not
          // moved, and its margin is not widened again.
          *active = std::move(*before);
          if (wider) active->margin_doublings = device_budget::max_margin_doublings;
          exec->follow(&active->recorded, &active->p, &active->layout);
        }
      }
    }
    if (io_failure) std::rethrow_exception(io_failure);
    return r;
  }

  void replan(const executor_stats& st) {
    if (take_kept_shape()) return;
    trace t;
    t.tensors = tensors;
    t.ops = ops;
    active->gather = op_gather;
    active->scratch = st.op_scratch_peak_bytes;
    if (st.op_ms.size() == t.ops.size()) {
      for (std::size_t k = 0; k < t.ops.size(); ++k)
        if (st.op_ms[k] >= 0) t.ops[k].measured_seconds = st.op_ms[k] / 1000.0;
    }
    active->margin_doublings = device_budget::no_margin;
    plan_trace(*active, std::move(t));
    active->retime = true;
  }

  /// An iteration of the active phase departed from its plan (Note [Shapes]): when its ops are
  /// those of a kept shape, that plan becomes the phase's again and true is returned; when the
  /// phase churns through new shapes and this one is not to be planned (Note [Shape churn]), its
  /// plan stays and true is returned; otherwise the plan it had is kept (the oldest kept one
  /// leaves) and false is returned, to plan anew.
  bool take_kept_shape() {
    if (!active->have_plan) return false;
    auto& kept = shapes[active];
    auto& c = churn[active];
    const auto same = std::find_if(kept.begin(), kept.end(), [&](const phase_state& k) { return same_ops(k.recorded); });
    if (same != kept.end()) {
      std::swap(*active, *same);  // the plan it followed is kept in its place
      std::rotate(kept.begin(), same, same + 1);
      exec->follow(&active->recorded, &active->p, &active->layout);
      return true;
    }
    if (c.planned_in_a_row >= churn_streak && ++c.skipped < churn_every) return true;  // Note [Shape churn]
    c.skipped = 0;
    ++c.planned_in_a_row;
    kept.push_front(std::move(*active));
    if (kept.size() > shapes_kept) kept.pop_back();
    *active = phase_state{};
    exec->follow(nullptr, nullptr);  // on demand until the new plan is made
    return false;
  }

  /// Whether this iteration's ops are those of `t`, op for op (same_op).
  bool same_ops(const trace& t) const {
    return std::equal(t.ops.begin(), t.ops.end(), ops.begin(), ops.end(), same_op);
  }

  // Note [Timing the plan's ops]
  // The op times a plan is made from are those of the recording iteration, the program's first
  // steps, where every kernel runs for the first time: on a GPU that is when CUDA loads it and
  // the libraries pick their algorithms and workspaces; on the cpu backend, when device memory is
  // first touched. Those times run long (GPT medium on the cpu backend: the ops of its recording
  // step add up to 7.4 s, those of later steps to 5.3), and a plan made from them counts on
  // compute that is not there to hide its copies behind. So the first iteration that follows a
  // plan made from a recording times its ops too, and when their times differ from the recorded
  // ones by more than a tenth of the step in all, the trace takes them and is planned again; the
  // iteration after that follows the new plan. Once per recording: later steps keep their plan.
  // An op the plan ran on the host keeps its recorded device time (op_ms has -1 there).
  static bool take_op_times(trace& t, const std::vector<double>& op_ms) {
    if (op_ms.size() > t.ops.size() || t.ops.empty()) return false;
    double before = 0, moved = 0;
    for (std::size_t k = 0; k < t.ops.size(); ++k) {
      const double old_s = t.ops[k].measured_seconds.value_or(0.0);
      before += old_s;
      if (k < op_ms.size() && op_ms[k] >= 0) moved += std::abs(op_ms[k] / 1000.0 - old_s);
    }
    if (!(moved > 0.1 * before)) return false;
    for (std::size_t k = 0; k < op_ms.size(); ++k)
      if (op_ms[k] >= 0) t.ops[k].measured_seconds = std::min(op_ms[k] / 1000.0, max_op_seconds);
    return true;
  }

  /// Plans `t` for phase `ph`; the executor follows it from the next iteration when `ph` is the
  /// active phase (else when that phase next begins).
  void plan_trace(phase_state& ph, trace t) {
    t.validate();
    const auto report = offload::analyze(t);
    offload::hw_profile hw;
    hw.name = std::string(to_string(dev->properties().backend)) + " (measured)";
    hw.device_bytes = stack->budget().bytes();
    hw.compute_flops_per_s = 1e12;
    hw.hbm_bytes_per_s = 1e11;
    hw.h2d_bytes_per_s = link.first;
    hw.d2h_bytes_per_s = link.second;
    hw.copy_engines = std::max(1, dev->properties().copy_engines);
    hw.host_bytes = cfg.host_budget != 0 ? cfg.host_budget : (std::uint64_t{1} << 50);
    hw.nvme_read_bytes_per_s = nvme_rates.first;
    hw.nvme_write_bytes_per_s = nvme_rates.second;
    hw.nvme_bytes = stack->nvme() == nullptr ? 0
                    : cfg.nvme.reserve != 0 ? stack->nvme()->stats().capacity_bytes
                                            : stack->nvme()->reservable_bytes();  // Note [Sizing the NVMe tier]
    offload::planner_options po;
    if (cfg.lms_swapout_threshold) po.swapout_threshold = static_cast<std::uint32_t>(cfg.lms_swapout_threshold);
    if (cfg.lms_swapin_ahead) po.swapin_ahead = static_cast<std::uint32_t>(cfg.lms_swapin_ahead);
    if (cfg.lms_swapin_groupby) po.swapin_groupby = static_cast<std::uint32_t>(cfg.lms_swapin_groupby);
    // Ops with a host implementation (Note [Host-capable ops] in session_host_ops.cpp): the host
    // as a resource, rated by its measured memory bandwidth, unless host_ops keeps them on the device.
    const bool host_capable = std::any_of(t.ops.begin(), t.ops.end(), [](const op_desc& o) { return o.host_capable; });
    if (host_capable && cfg.host_ops != "device") {
      hw.host_mem_bytes_per_s = host_memory_rate();
      hw.host_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      hw.host_vector_width = 16;  // 8 fp32 lanes, one FMA unit
      hw.host_clock_hz = 2e9;
    }
    auto p = offload::make_planner(planner_name(cfg), po);
    if (host_capable && cfg.host_ops == "host") p = offload::detail::make_all_on_host_planner(std::move(p));
    // Plan for the whole budget less the ops' scratch where that plan's packed layout fits there,
    // else under the budget by the packing margin (Note [Headroom]) and lower still until the
    // packed layout fits; the executor's on-demand path covers what the plan misses.
    // Nothing of `ph` changes until every check has passed: a plan refused leaves the phase as
    // it was, following its old plan.
    auto fitted = offload::fit_plan(*p, t, report, hw, stack->budget(), ph.margin_doublings, exec->release_points(),
                                    ph.scratch);
    double predicted_ms = fitted.predicted_seconds * 1e3;
    if (edit_plan) {  // session_hooks::edit_plan
      edit_plan(t, fitted.p);
      fitted.layout = make_layout(t, fitted.p, exec->release_points());
      predicted_ms = 0;  // not the plan that was timed
    }
    fitted.p.validate(t);
    if (stack->nvme() != nullptr) {  // Note [Sizing the NVMe tier]
      const std::uint64_t need = nvme_bytes_of(fitted.p, t, stack->nvme()->options());
      if (cfg.nvme.reserve == 0) {
        stack->nvme()->reserve(need);
      } else if (need > stack->nvme()->stats().capacity_bytes) {
        throw config_error("nvme.reserve: " + format_bytes(cfg.nvme.reserve) + " reserved, but the plan for budget " +
                           format_bytes(stack->budget().bytes()) + " may keep " + format_bytes(need) +
                           " on the NVMe tier at once (each tensor in whole blocks of nvme.block_size, " +
                           format_bytes(cfg.nvme.block_size) + "); give nvme.reserve of at least " + format_bytes_at_least(need) +
                           ", 0 to size it from the plan, or a larger host_budget");
      }
    }
    check_host_tier(t, report, fitted.p, hw, cfg, stack->nvme() != nullptr);
    ph.p = std::move(fitted.p);
    ph.margin_doublings = fitted.margin_doublings;
    ph.predicted_ms = predicted_ms;
    ph.recorded = std::move(t);
    ph.layout = std::move(fitted.layout);
    ph.footprint = report.peak_live_bytes;
    ph.least = 0;
    for (std::size_t k = 0; k < ph.recorded.ops.size(); ++k) {
      const std::uint64_t gather = k < ph.gather.size() ? ph.gather[k] : 0;
      ph.least = std::max(ph.least, placed_bytes(ph.recorded.ops[k]) + gather);
    }
    ph.have_plan = true;
    if (&ph == active) exec->follow(&ph.recorded, &ph.p, &ph.layout);  // the executor copies the layout
  }

  /// Device memory an op's tensors take once placed (device_budget::placed). The least budget
  /// that can run the op.
  std::uint64_t placed_bytes(const op_desc& op) const {
    std::vector<tensor_id> ids = op.reads;
    ids.insert(ids.end(), op.writes.begin(), op.writes.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::uint64_t sum = 0;
    for (auto id : ids) sum += device_budget::placed(tensors[id].bytes);
    return sum;
  }

  void write_chrome_trace(const std::string& path) const {
    offload::write_session_chrome_trace(path, exec->timeline(), exec->memory_timeline(), stack->budget().bytes());
  }

  session_config cfg;
  std::unique_ptr<Device> dev;
  std::pair<double, double> link{0, 0};
  /// NVMe read and write bytes/s: measured when the Session opens (measure_speed); these figures
  /// (one data-centre drive) only when there was nothing to measure or a test seam replaced the I/O.
  std::pair<double, double> nvme_rates{2e9, 1.5e9};
  std::unique_ptr<executor_stack> stack;
  executor* exec = nullptr;

  std::vector<tensor_desc> tensors;
  std::unordered_map<std::string, tensor_id> by_name;
  std::vector<op_desc> ops;  // this iteration's, as recorded
  std::vector<Session::op_body> bodies;  // per op of this iteration: a recomputable op's body, else empty
  std::optional<op_index> rerunning;     // the op whose body runs again now (Note [Recomputable ops])
  std::uint64_t iterations_ended = 0;    // ended without failing, and before a load (Note [Op seeds] in session.cpp)
  std::vector<char> reruns_planned;      // per op: the followed plan reruns it (Note [Checking reruns])
  std::unordered_map<op_index, std::vector<std::pair<tensor_id, std::uint32_t>>> first_runs;  // and what it wrote
  std::unordered_set<tensor_id> touched;  // tensors an op of this iteration has read or written
  // Note [Sums no op read], per piece: holding an accumulation nothing read since; the iterations
  // whose such sums a zero-fill discarded since the piece was last read; last read after such a loss.
  std::unordered_set<tensor_id> unread_sums;
  std::unordered_map<tensor_id, int> lost_sums;
  std::unordered_set<tensor_id> lossy_reads;
  std::unordered_set<tensor_id> added;    // transients added (again) in this iteration
  std::unordered_set<tensor_id> live;     // of those, the ones not released since
  std::unordered_map<tensor_id, std::vector<std::byte>> last_metrics;  // Note [Metrics after the step]
  using shape_key = std::tuple<std::string, std::uint64_t, tensor_kind>;
  std::map<shape_key, std::vector<tensor_id>> shape_ids;  // each transient's ids per size (Note [Shapes])
  std::map<const phase_state*, std::deque<phase_state>> shapes;  // per phase: its kept plans, newest first
  std::map<const phase_state*, shape_churn> churn;                 // per phase (Note [Shape churn])
  std::vector<std::uint64_t> op_gather;   // this iteration's ops' gather scratch (Note [Views])

  /// The open op's tensors as the loop named them (a parent, not its pieces).
  struct named_tensor {
    tensor_id id = 0;
    bool read = false;     // read or accumulated: its value is needed
    bool written = false;  // written or accumulated
    void* gather = nullptr;  // a split parent's contiguous copy (Note [Views])
  };
  std::vector<named_tensor> open_named;
  /// A piece of a parent: a view, or the bytes between views.
  struct piece {
    tensor_id id = 0;
    std::uint64_t offset = 0;
  };
  struct split_parent {
    std::vector<piece> pieces;  // the views while pending; views and gaps by offset once in force
    bool finalized = false;
  };
  std::map<tensor_id, split_parent> splits;           // by parent
  std::unordered_map<tensor_id, tensor_id> parent_of;  // view or gap -> its parent
  std::unordered_set<tensor_id> named_ever;            // tensors an op or read has named
  bool stage_host_runs = false;   // session_hooks::stage_host_runs (Note [Host runs])
  std::function<void(const trace&, plan&)> edit_plan;  // session_hooks::edit_plan
  void* host_staging = nullptr;   // pinned bytes for op_scope::run on a GPU (session_host_run.cpp)
  std::uint64_t host_staging_bytes = 0;
  std::map<std::string, phase_state, std::less<>> phases;  // by tag (Note [Phases])
  phase_state* active = nullptr;  // the phase of the current or last iteration (map nodes stay put)
  bool following = false;
  bool in_iteration = false;
  bool iteration_failed = false;  // a device, tier or memory error left one of its calls (Note [Failed iterations])
  bool op_open = false;
  struct awaited_state {  // Note [State added after load] (session_checkpoint.cpp)
    std::string dir;
    std::uint64_t bytes = 0;
  };
  std::map<std::string, awaited_state, std::less<>> awaiting_add;  // by name
  std::uint64_t ops_opened = 0;   // ops Session::op has opened; a scope holds its number (Note [Stale scopes])
  std::thread::id op_thread;      // the thread that opened the open op (Note [One thread at a time])
  std::atomic<std::thread::id> caller{};  // the thread inside a Session call (Note [One thread at a time])
  bool open_on_host = false;      // the open op runs on the host (begin_host_op)
  std::vector<void*> host_ptrs;   // its host pointers: its trace reads, then its trace writes
  double host_rate = 0;           // host_memory_rate(), once measured
  bool ratio_applied = false;  // the device_budget_ratio setting was resolved
  std::exception_ptr ratio_refused;  // the ratio gave too small a budget: every later step is refused
  std::vector<iteration_report> history;
  std::chrono::steady_clock::time_point iteration_start;
};

}  // namespace spillway
