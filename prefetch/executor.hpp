// The executor: runs a Plan on the device's streams. Prefetches go on the H2D stream ahead of
// use, swap-outs on the D2H stream behind the producing op, and each op waits only on the events
// of its own tensors. When the plan misses, it fetches or evicts on demand and counts a stall.
//
// Glossary. *Resident*: the tensor has device memory. *Valid on device*: that memory holds the
// tensor's current value. *Tier copy*: a copy in the host or NVMe tier (tensor_backing); it is
// *current* until an op writes the tensor. *Stall*: time the compute stream waited for a tensor
// that was not ready when the op reached the head of the stream.
#pragma once

#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "allocator/arena_allocator.hpp"
#include "device/device.hpp"
#include "prefetch/iteration_counters.hpp"
#include "prefetch/layout.hpp"
#include "prefetch/memory_sample.hpp"
#include "prefetch/plan.hpp"
#include "prefetch/recompute.hpp"
#include "prefetch/tensor_backing.hpp"
#include "prefetch/trace.hpp"
#include "swap/move_handle.hpp"

namespace spillway {

struct executor_options {
  /// Tier for on-demand evictions when a plan does not say.
  tier spill_tier = tier::host;
  /// Record op and copy timestamps for a timeline (two timing events per item of work).
  bool timeline = false;
};

/// One item of the timeline: an op on the compute track, a copy on a copy track, an op placed on
/// the host on the host track, or a rerun (Note [Recomputation] in prefetch/plan.hpp) on the
/// recompute track: it runs on the compute stream, in order with the ops, and shows apart.
struct timeline_item {
  enum class track : std::uint8_t { compute, h2d, d2h, stall, nvme_read, nvme_write, host, recompute };
  track where = track::compute;
  std::string name;
  double start_us = 0;  ///< since the executor was made
  double end_us = 0;
};

/// The counters (prefetch/iteration_counters.hpp), plus what only the executor sees.
struct executor_stats : iteration_counters {
  double step_ms = 0;
  std::vector<std::pair<std::string, double>> stalls;  ///< tensor name, ms
  /// Timed iterations only: each op's measured duration on the device, by op index; -1 for an op
  /// that did not run there (a host op).
  std::vector<double> op_ms;
};

class executor {
 public:
  /// Places tensors and scratch in `arena` and keeps them within its budget (device_budget.hpp);
  /// the arena's budget is the executor's. `arena` and `backing` must outlive the executor.
  executor(Device& device, arena_allocator& arena, tensor_backing& backing, executor_options options);
  ~executor();
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;

  /// Declares tensor `id` (ids are dense from 0). Re-declaring with the same size is a no-op.
  void define(tensor_id id, const tensor_desc& desc);
  /// Sets a persistent tensor's value from host memory (stored in `where`, host by default).
  /// One that throws leaves the tensor its earlier value.
  void upload(tensor_id id, const void* host, tier where = tier::host);
  /// Per transient, the op after which the program last released it (-1: not seen), for
  /// make_layout (prefetch/layout.hpp).
  [[nodiscard]] std::span<const std::int64_t> release_points() const noexcept { return released_after_; }
  /// Copies a tensor's current value to host memory, waiting for the work that writes it.
  void read(tensor_id id, void* host);
  /// Throws usage_error naming the tensor when read() could not give its value: the program
  /// released it in this iteration, or nothing has written it yet.
  void check_readable(tensor_id id);

  /// Follow `p` for trace `t` from the next iteration on; null: run on demand (recording).
  /// Both must outlive their use; the executor keeps pointers. `layout`, where given, is the
  /// packing to place the plan's allocations by (copied); else the executor packs the plan itself
  /// (make_layout without copy timings). Either is used only when it fits the budget.
  void follow(const trace* t, const plan* p, const device_layout* layout = nullptr);
  /// Runs op `o` of the current iteration again (Note [Recomputation] in prefetch/plan.hpp): the
  /// owner enqueues on compute_stream() the same work op o did, on device_ptr() of o's tensors,
  /// and may take scratch(). Called from begin_op(k) for each entry of the plan's
  /// steps[k].recomputes, with o's reads resident and loaded and its writes resident.
  using rerun_fn = std::function<void(op_index o)>;
  void set_rerun(rerun_fn f) { rerun_ = std::move(f); }
  /// Measure every op's duration in the coming iterations (for recording).
  void set_timing(bool on) noexcept { timing_ = on; }

  void begin_iteration();
  /// Issues the plan's prefetches for k, runs its recomputations (set_rerun), makes op k's
  /// tensors resident (fetching or allocating), and makes the compute stream wait for exactly
  /// these tensors.
  void begin_op(op_index k, std::span<const tensor_id> reads, std::span<const tensor_id> writes,
                const std::string& name);
  /// The same, with scratch the op needs from its start (`scratch`: the size of each buffer),
  /// placed with its tensors, so that free memory in pieces is made whole first, as for them
  /// (scratch() asked for later cannot move the op's tensors, whose pointers the owner may hold).
  /// Returns the buffers, freed like scratch() when the op ends.
  [[nodiscard]] std::vector<void*> begin_op(op_index k, std::span<const tensor_id> reads,
                                            std::span<const tensor_id> writes, const std::string& name,
                                            std::span<const std::uint64_t> scratch);
  /// Records the op's completion, marks what it wrote, and issues the plan's evictions after k.
  void end_op(op_index k);
  /// Whether the plan this iteration follows places op k on the host (Note [Host ops] in
  /// prefetch/plan.hpp). An owner that then runs op k on the device (begin_op) departs from the
  /// plan: the rest of the iteration runs on demand.
  [[nodiscard]] bool placed_on_host(op_index k) const noexcept;
  /// Op k on the host (Note [Host ops in the executor] in executor_host.cpp): issues the plan's
  /// prefetches for k and waits, on this thread, until every tensor the op names has a current
  /// host-tier copy that no copy still uses (a value only on the device is copied out first).
  /// Returns the host pointer of each tensor, in the order of `reads` then `writes`. The owner
  /// runs the op's host code over them on this thread, then calls end_host_op(k); device work
  /// enqueued before runs on meanwhile, and device copies of what the op writes are dropped.
  [[nodiscard]] std::vector<void*> begin_host_op(op_index k, std::span<const tensor_id> reads,
                                                 std::span<const tensor_id> writes, const std::string& name);
  /// After op k's host code: what it wrote is current in its host-tier copy (only there), then
  /// the plan's evictions after k.
  void end_host_op(op_index k);
  /// Closes the open op, if any, that the owner cannot end because an exception left its code
  /// (Note [Abandoned ops] in executor_failures.cpp), so that end_iteration may follow. Also
  /// after a begin_op or begin_host_op that threw. Throws the device's error if giving memory
  /// back fails; the op is closed all the same.
  void abandon_op();
  /// A transient tensor's life ends; its device memory and tier copy go back.
  void release(tensor_id id);
  /// A tensor's device memory and tier copy go back and it holds no value from now on, whatever
  /// its kind: for a persistent tensor whose bytes now live in other tensors (a parent split
  /// into views). Outside an op.
  void retire(tensor_id id);
  /// Undoes define(id) for a tensor its owner could not register after all (its first value
  /// found no room): its copies go back and the id may be defined afresh. Outside an op.
  void forget(tensor_id id);
  /// Waits for the iteration, leaves persistent tensors where the plan starts them, reports.
  executor_stats end_iteration();

  /// Stop following the plan for the rest of this iteration (the ops departed from the trace).
  void abandon_plan() noexcept { plan_ = nullptr; }

  /// `bytes` of device memory for the current op (between begin_op and end_op), on the compute
  /// stream, freed there when the op ends: scratch counted in the budget like a tensor, making
  /// room by evicting tensors the op does not use. Outside an op it is a usage_error.
  [[nodiscard]] void* scratch(std::uint64_t bytes);
  /// Between iterations: every tensor leaves the device for its tier (a copy out where the tier's
  /// copy is stale), and the executor waits until the arena holds nothing. For a change of budget.
  void leave_device();
  /// The budget the executor keeps within: its arena's.
  [[nodiscard]] const device_budget& budget() const noexcept { return arena_->budget(); }

  [[nodiscard]] void* device_ptr(tensor_id id) const;
  [[nodiscard]] stream compute_stream() const noexcept { return compute_.get(); }
  [[nodiscard]] Device& device() const noexcept { return *device_; }
  [[nodiscard]] std::uint64_t device_bytes_in_use() const noexcept { return in_use_; }
  [[nodiscard]] const std::deque<timeline_item>& timeline() const noexcept { return timeline_; }
  [[nodiscard]] const std::vector<memory_sample>& memory_timeline() const noexcept { return memory_samples_; }

 private:
  struct tensor_state;
  struct probe;
  struct stamp;

  tensor_state& state(tensor_id id);
  bool fetch(tensor_id id, bool on_demand);
  void* allocate_for(tensor_id id, stream s, bool may_evict);
  void* allocate_bytes(std::uint64_t bytes, stream s, bool may_evict, const tensor_state* for_tensor);
  void free_device(tensor_state& st, stream s);  // gives st's device memory back, freed on s
  void synchronize_streams();                    // waits for compute, h2d and d2h
  // Defragments if need be; `scratch`: buffers placed with the tensors (appended to scratch_).
  void place_op_tensors(std::span<const tensor_id> reads, std::span<const tensor_id> writes,
                        std::span<const std::uint64_t> scratch = {});
  void wait_pinned();                            // compute waits for the loads of pinned_ tensors
  void free_scratch();                           // the open op's scratch, freed on compute
  void issue_prefetches(op_index k);             // the plan's prefetches at step k
  void apply_evictions(op_index k);              // the plan's evictions after op k
  void wait_if_synchronous(op_index k);          // a synchronous step waits for all earlier work
  // Recomputation (executor_recompute.cpp, Note [Rerun checks]).
  void run_recomputes(op_index k);
  void rerun(op_index o, op_index k, std::vector<tensor_id>& made);
  void run_reruns_on_demand(op_index k, std::span<const tensor_id> reads,  // Note [Reruns on demand]
                            std::span<const tensor_id> writes);
  void remake(tensor_id id, op_index before, op_index k, std::vector<tensor_id>& made);
  bool dropped_for_rerun(tensor_id id);
  void note_op_inputs(op_index k, std::span<const tensor_id> reads);
  void note_op_outputs(op_index k);
  void free_rerun_temps(op_index k);
  [[noreturn]] void throw_awaiting_rerun(const tensor_state& st, const std::string& reader) const;
  /// A read (`reader`: "op 3 (\"adam\") reads", "a host read of") of a tensor that holds no value: a
  /// transient not yet written, or a gradient the plan dropped after its last use (Note [Dropped gradients]).
  [[noreturn]] static void throw_no_value(const tensor_state& st, const std::string& reader);
  void defragment();
  bool evict_one(std::uint64_t needed);
  /// `keep`: tensors whose tier copies stay if the tier is full (Note [Redundant tier copies]);
  /// empty: `id`'s.
  void evict(tensor_id id, tier to, bool on_demand, std::span<const tensor_id> keep = {});
  /// Lets go of the tier copies that the device holds again (Note [Redundant tier copies]),
  /// but those of `keep`; how many.
  std::size_t free_redundant_copies(std::span<const tensor_id> keep);
  /// `store()`, run again once after free_redundant_copies(keep) when the host tier is full.
  template <class Store>
  auto with_tier_room(std::span<const tensor_id> keep, Store store) {
    try {
      return store();
    } catch (const out_of_memory&) {
      if (free_redundant_copies(keep) == 0) throw;
    }
    return store();
  }
  void drop_device(tensor_id id);
  void note_memory();
  [[nodiscard]] std::uint64_t next_use(tensor_id id) const;
  void note_scratch();  // the open op's scratch, for op_scratch_peak_bytes
  [[nodiscard]] bool value_dead_after(tensor_id id, op_index k) const;
  /// Per the trace: its first op overwrites it without reading.
  [[nodiscard]] bool value_dead_before_first_use(tensor_id id) const;
  [[nodiscard]] double now_us() const;
  event timing_event();         // from the pool (Note [Timing events])
  event mark_time(stream s);     // a timing event recorded on s now
  timeline_item* stamp_start(stream s, timeline_item::track track, const std::string& name);
  void stamp_end(stream s, timeline_item* item);
  void read_stamps();            // after the iteration's synchronize
  void wait_landed(stream s, tensor_state& st);  // s waits for st's load to be on the device
  bool landed(tensor_state& st);                 // st's load is on the device (never blocks)
  void check_loads(std::span<const tensor_id> ids);
  // Note [Failed loads]: true when id's load from NVMe failed; its device copy is then gone.
  bool forget_failed_load(tensor_id id);
  void forget_failed_loads();  // waits for every NVMe load in flight; forgets those that failed
  void rethrow_move_errors();
  void adopt_layout();

  Device* device_;
  arena_allocator* arena_;
  tensor_backing* backing_;
  executor_options options_;
  owned_stream compute_;
  owned_stream h2d_;
  owned_stream d2h_;
  owned_event op_done_;
  bool op_done_current_ = false;    // op_done_ was recorded after the last work enqueued on compute
  bool d2h_waits_op_done_ = false;  // d2h already waits on that recording

  std::vector<std::unique_ptr<tensor_state>> tensors_;
  const trace* trace_ = nullptr;
  const plan* plan_ = nullptr;
  const plan* next_plan_ = nullptr;
  const trace* next_trace_ = nullptr;
  std::vector<std::vector<op_index>> uses_;  // per tensor, the ops (of trace_) that touch it
  std::optional<device_layout> layout_;      // for plan_, when it fits the arena and the budget
  std::optional<device_layout> next_layout_; // given with next_plan_
  bool follow_pending_ = false;              // follow() since the last begin_iteration
  std::uint32_t alloc_slot_ = 0;             // layout_slot of the allocations being made now
  bool best_fit_only_ = false;               // place_op_tensors after defragmenting: no layout
  std::vector<std::int64_t> released_after_; // per transient: op after which release() came (last iteration)
  rerun_fn rerun_;                           // set_rerun
  rerun_index reruns_;                       // for plan_ (Note [Drops for recomputation])
  struct op_values {                         // a recomputable op's tensors' versions when it ran
    bool ran = false;
    std::vector<std::pair<tensor_id, std::uint64_t>> reads, writes;
  };
  std::vector<op_values> ran_;               // per op of this iteration (recomputable ops only)
  std::vector<std::vector<op_index>> ran_readers_;  // per tensor, the ops of ran_ that read it (Note [Reruns on demand])
  std::vector<tensor_id> rerun_temps_;       // released tensors reruns made (Note [Rerun temps across steps])

  op_index current_op_ = 0;
  std::string current_name_;  // the op begun last (begin_op's name), for errors
  std::uint64_t clock_ = 0;  // op counter across iterations, for LRU while recording
  std::vector<tensor_id> pinned_;  // the current op's tensors: never evicted while it runs
  std::vector<tensor_id> writes_;  // the current op's written tensors
  std::vector<std::pair<void*, std::uint64_t>> scratch_;  // the current op's scratch
  bool op_open_ = false;           // between begin_op and end_op (or begin_host_op and end_host_op)
  bool op_ended_ = false;          // op current_op_ has ended (end_op or end_host_op has begun)
  bool host_op_open_ = false;      // between begin_host_op and end_host_op
  double host_op_start_us_ = 0;
  timeline_item* open_op_ = nullptr;
  std::vector<std::pair<op_index, timeline_item*>> op_items_;  // this iteration's device ops, for op_ms
  std::uint64_t in_use_ = 0;
  std::uint64_t peak_ = 0;
  bool timing_ = false;
  bool in_iteration_ = false;

  std::chrono::steady_clock::time_point origin_;
  std::chrono::steady_clock::time_point iteration_start_;
  std::deque<probe> probes_;
  std::deque<stamp> stamps_;
  std::deque<owned_event> timing_events_;  // reused every iteration
  std::size_t timing_used_ = 0;
  // Recorded on compute, h2d and d2h at begin_iteration, at host time origin_us_: each stream's
  // stamps are read against its own origin (Note [Timing events]).
  event origin_event_{};
  event origin_h2d_{};
  event origin_d2h_{};
  [[nodiscard]] event origin_of(stream s) const noexcept;
  double origin_us_ = 0;
  std::deque<timeline_item> timeline_;
  std::vector<memory_sample> memory_samples_;
  executor_stats stats_;
  backing_counters counters_at_start_;
  double host_stall_ms_ = 0;
};

}  // namespace spillway
