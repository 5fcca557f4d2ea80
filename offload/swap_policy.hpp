// The swap-policy header: the one header a training loop includes. A Session owns the device,
// the tiers and the executor; the loop registers tensors, marks iterations and wraps each op.
//
//   spillway::Session s(spillway::session_config::from_env());
//   auto w = s.add_persistent("fc.weight", bytes, spillway::tensor_kind::parameter, init);
//   for (int step = 0; step < steps; ++step) {
//     s.begin_iteration();
//     auto y = s.add_transient("fc.out", out_bytes);
//     { auto op = s.op("fc.forward", {w, x}, {y});          // w, x, y resident inside the scope
//       my_gemm(op.ptr<float>(x), op.ptr<float>(w), op.ptr<float>(y), op.stream()); }
//     ...
//     s.release(y);                                          // transient: dead after its last use
//     auto report = s.end_iteration();
//   }
//
// Iteration 1 runs on demand and records the trace (with measured durations); the Session then
// plans with the configured policy, and later iterations follow the plan, prefetching ahead of
// use and swapping out behind. A different sequence of ops or sizes triggers a new recording
// and a new plan; begin_iteration("eval") gives another phase its own recording and plan.
// The budget may be a fraction of the recorded footprint (device_budget_ratio). Whatever the
// plan, results are bit for bit those of an unlimited device, and device memory in use never
// exceeds the budget.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.hpp"
#include "device/error.hpp"  // the exception kinds a Session throws (config_error, usage_error, ...)
#include "device/units.hpp"  // parse_size, format_bytes: sizes as the settings write them
#include "offload/session_config.hpp"
#include "prefetch/iteration_counters.hpp"
#include "prefetch/plan.hpp"
#include "prefetch/trace.hpp"

namespace spillway {

/// A tensor registered with a Session. Cheap to copy.
struct tensor_handle {
  tensor_id id = 0;
};

/// A tensor an op waited for, and for how long.
struct stall_record {
  std::string tensor;
  double ms = 0;
};

/// What one iteration did.
/// stall_ms, the bytes moved per direction, peak_device_bytes, op_scratch_peak_bytes,
/// on_demand_fetches/evictions, prefetches_deferred, fragmented_allocations, layout and
/// layout_misses come from iteration_counters (prefetch/iteration_counters.hpp), as the executor
/// counted them.
struct iteration_report : iteration_counters {
  std::uint64_t iteration = 0;   ///< 1-based
  bool planned = false;          ///< followed a plan (false: on demand, recording)
  std::string policy;            ///< planner whose plan it followed
  double step_ms = 0;            ///< wall time from begin_iteration to end_iteration
  /// The simulator's step time for the plan it followed, on the hardware the Session measured
  /// (its link, the recorded op times): what step_ms would be if the run went as planned. 0 when
  /// it followed no plan (or a test's edited one).
  double planned_step_ms = 0;
  std::vector<stall_record> stalls;
};

class session_impl;
struct session_hooks;

/// Used by one thread at a time: a call from a second thread while another is inside a call or
/// holds an op's scope open is a usage_error (Note [One thread at a time] in
/// offload/session_call.hpp); threads that take turns are fine.
class Session {
 public:
  /// Validates the config, opens the device and the tiers (a missing or full swap directory is
  /// an error here, before any work).
  explicit Session(session_config config);
  /// The same, with seams for tests and tools (offload/session_hooks.hpp).
  Session(session_config config, const session_hooks& hooks);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  [[nodiscard]] Device& device();
  /// The stream every op's stream() is, the same for the Session's life: a loop that gives its
  /// library handles a stream once, at its start (cublasSetStream, cudnnSetStream), gives them
  /// this one. On CUDA, work launched with no stream inside an op's scope is ordered with it too
  /// (Note [The default stream] in prefetch/executor.cpp); a stream of the loop's own is not.
  [[nodiscard]] spillway::stream stream() const noexcept;
  [[nodiscard]] const session_config& config() const noexcept;
  /// The device budget in force (the config's, or the device's free memory when it gave none,
  /// or the last set_device_budget's): every device byte the Session holds, tensors and op
  /// workspaces together. The room kept around it is Note [Headroom] in allocator/device_budget.hpp.
  [[nodiscard]] std::uint64_t device_budget() const noexcept;
  /// Changes the device budget between iterations (after end_iteration, before begin_iteration):
  /// every tensor leaves the device for its tier, the device memory is reserved again for `bytes`,
  /// and the recorded trace, if any, is planned again for it, so the next iteration follows the
  /// new plan. A budget of 0, above the device's memory, or below least_budget_bytes() is a
  /// config_error that names it and what would fit, and changes nothing; so is one whose plan
  /// would keep more in the host or NVMe tier than they hold. Inside an iteration it is
  /// a usage_error. When the device cannot give that much now (memory others hold on a GPU), it is
  /// an out_of_memory and the old budget stays. Results do not change with the budget.
  void set_device_budget(std::uint64_t bytes);

  /// A tensor that lives across iterations (parameter, gradient, optimizer state). Its initial
  /// contents are copied from `initial` (`bytes` bytes), or are zero when it is null. Its name is
  /// the tensor: adding a name already added is a config_error (a second add would share the
  /// first's memory and overwrite its value). It may be added inside an iteration, as state a
  /// loop makes lazily at its first step.
  tensor_handle add_persistent(std::string name, std::uint64_t bytes, tensor_kind kind, const void* initial = nullptr);
  /// A tensor created within the current iteration (activation, workspace, metric). Its first op must
  /// write it; release() it after its last use. The same name in every iteration is the same
  /// tensor as far as planning goes; added again after its release() in the same iteration (a
  /// loop over micro-batches) it starts a new value; added again while its value is live, it is
  /// another tensor of the same name.
  tensor_handle add_transient(std::string name, std::uint64_t bytes, tensor_kind kind = tensor_kind::activation);
  /// A view: the bytes [offset, offset + bytes) of a persistent tensor, named on its own (empty
  /// `name`: "PARENT[offset:end]"). An op may name views, or the parent, which stands for all of
  /// it (views and the bytes between them), as an optimizer step over one flat buffer does; the
  /// planner moves only what ops name, so a flat buffer with a view per layer moves per layer.
  /// Views of one parent must not overlap; they are added before any op or read names the
  /// parent (outside an iteration), and read() and write() see the parent whole. A checkpoint
  /// holds each view, and the bytes between views, under a name of its own, so it loads into a
  /// Session that adds the same views (load says so when the views differ). Inside an
  /// op that names the parent, ptr(parent) is one contiguous buffer: the library gathers the
  /// pieces into op scratch first and scatters what the op writes back after it, so such an op
  /// needs the parent's bytes twice on the device (Note [Views] in session_views.cpp).
  tensor_handle add_view(tensor_handle parent, std::uint64_t offset, std::uint64_t bytes, std::string name = {});
  /// Ends a transient tensor's life in this iteration; its memory is reused.
  void release(tensor_handle t);
  /// Copies a tensor's current contents to host memory (waits for the ops that write it). Inside
  /// an iteration (between op scopes) the read is an op of the recorded trace, "host read: NAME",
  /// so the plan keeps or brings back the value for it, in every iteration; a transient the
  /// host reads each iteration (a loss, a metric) is best of kind tensor_kind::metric. Reading a
  /// transient after release() in the same iteration, or before any op wrote it, is a
  /// usage_error naming it. Between iterations a transient has no value, but for the metrics
  /// (tensor_kind::metric) the last iteration wrote and did not release: their last values stay
  /// readable until the next begin_iteration(), for a loop that prints its loss after the step
  /// (Note [Metrics after the step] in session_ops.cpp). A gradient that the recorded iteration
  /// overwrites before reading again may have been dropped after its last read (an error says so
  /// and how to read it: inside the step, in steps under their own tag; Note [Dropped gradients]
  /// in prefetch/executor.cpp); parameters and optimizer state never are.
  void read(tensor_handle t, void* host, std::uint64_t bytes);
  /// Replaces a persistent tensor's contents with `bytes` bytes (its size) from host memory,
  /// between iterations, wherever the tensor lives: weights loaded from a file of the loop's own
  /// format, an averaged copy swapped in for an evaluation and back, a layer initialised again.
  /// A parent split into views is written whole, a view its own range. Inside an iteration,
  /// write in an op instead (an op that writes the tensor, with a copy on op.stream()). A write
  /// whose value cannot be stored (the host tier full, an NVMe write refused) throws and leaves
  /// the tensor its earlier value.
  void write(tensor_handle t, const void* host, std::uint64_t bytes);

  /// Writes a checkpoint of every persistent tensor (wherever it lives: device, host or NVMe) to
  /// directory `dir`, with `meta` (the loop's own state: a step count, a data position) beside it.
  /// Each tensor carries a CRC; the checkpoint is written to temporary files, synced and renamed
  /// into place, so a crash during save leaves the previous checkpoint in `dir` whole. It also
  /// keeps how many iterations the Session has ended, which numbers op seeds (op_scope::seed).
  /// Outside an iteration only.
  void save(const std::string& dir, std::string_view meta = {});
  /// Loads a checkpoint that save() wrote into the registered persistent tensors and returns its
  /// `meta`. A checkpoint whose tensors differ from those registered (a name, a size, a kind, one
  /// missing or extra) or whose bytes fail their CRC is a corruption_error or config_error naming
  /// the first difference, and changes no tensor. The Session then counts its iterations on from
  /// the saved count, so op seeds go on as in the run that saved. A value that cannot be stored
  /// (the host tier full, an NVMe write refused) ends the load with that error: the tensors
  /// before it hold the checkpoint's values, it and those after it their earlier ones, none
  /// lost; load again once the cause is gone. Optimizer state the loop creates in its first step
  /// (as optimizers that make their moments on first use do) may be missing from the Session at
  /// load: the checkpoint's value is kept in the file and set when add_persistent adds that name
  /// (its size and kind must match; the initial value given there is not used); a save() before
  /// then copies it from that checkpoint, so none is dropped (Note [State added after load]).
  /// Outside an iteration only.
  std::string load(const std::string& dir);

  /// Starts an iteration of the phase `tag` ("train", "eval", ...). Each phase keeps its own
  /// recorded trace and plan: its first iteration runs on demand and is recorded, later ones
  /// follow its plan, so alternating phases do not record again. An iteration whose ops depart
  /// from its phase's trace finishes on demand, with the same results, and is recorded and
  /// planned again for that phase.
  void begin_iteration(std::string_view tag = "train");
  /// Waits for the iteration's work, plans after a recording iteration, and reports.
  iteration_report end_iteration();
  /// Gives up the current iteration, if any, as a failed one: a loop whose own code threw
  /// between ops and that skips the step (Note [Failed iterations] in offload/session_impl.hpp).
  /// Its work is waited for; nothing is planned or reported from it; each tensor holds its value
  /// from before the step or what the step's ops made of it. An error that left a Session call
  /// or an op's scope needs no such call: the next begin_iteration ends that step the same way.
  /// From a thread other than the one inside a call or holding an op open, it does nothing and
  /// returns false (the step is that thread's to end); true otherwise, with or without a step.
  bool abandon_iteration() noexcept;

  /// One op: inside the scope the tensors it names are resident, their device pointers valid,
  /// and stream() is the stream to launch on. Ops run one after another, in program order.
  class op_scope {
   public:
    ~op_scope() noexcept(false);  // ending an op may report an error (e.g. no room to swap out)
    op_scope(op_scope&& other) noexcept;
    op_scope(const op_scope&) = delete;
    op_scope& operator=(const op_scope&) = delete;
    op_scope& operator=(op_scope&&) = delete;

    /// Device pointer of a tensor the op names (others are an error).
    template <class T = void>
    [[nodiscard]] T* ptr(tensor_handle t) const {
      return static_cast<T*>(raw_ptr(t));
    }
    [[nodiscard]] spillway::stream stream() const noexcept;
    [[nodiscard]] Device& device() const noexcept;
    /// A seed for the op's random draws (a dropout mask): the same at the op's first run and at
    /// each of its reruns, different for every other op and iteration, the same again when a
    /// failed step is run again or a saved run resumes (Note [Op seeds] in session.cpp). A recomputable op that draws random numbers seeds a counter-based generator
    /// with it (Philox, as curand's is, or a generator made afresh from it) instead of drawing
    /// from one that moves on at every call, so a rerun draws what the first run drew.
    [[nodiscard]] std::uint64_t seed() const;
    /// Host pointers to the op's tensors, inside run().
    class host_access {
     public:
      template <class T = void>
      [[nodiscard]] T* ptr(tensor_handle t) const {
        return static_cast<T*>(raw_ptr(t));
      }

     private:
      friend class op_scope;
      friend class spillway::session_impl;
      explicit host_access(const op_scope* op) : op_(op) {}
      [[nodiscard]] void* raw_ptr(tensor_handle t) const;
      const op_scope* op_;
      std::vector<std::pair<tensor_id, void*>> ptrs_;
    };
    /// Runs `f` on the host, in stream order (after the op's earlier device work, before its later
    /// work), with host pointers to the op's tensors: plain C code that loops over arrays runs here
    /// unchanged. On the cpu backend they are the device memory itself; on a GPU they are host
    /// copies, copied in before `f` and, for tensors the op writes or accumulates, copied back
    /// after it. Returns when `f` has run; an exception `f` throws reaches the caller. Host code
    /// must not touch ptr() memory outside run(): that races with the device (the cpu backend's
    /// debug mode, cpu_debug_host_access, stops such an access with a message).
    void run(const std::function<void(const host_access&)>& f) const;
    /// `bytes` of device scratch for this op (a library's workspace, a kernel's temporary), valid
    /// on stream() until the scope ends, when it is freed in stream order. It counts in the device
    /// budget like a tensor: room is made by evicting tensors this op does not name, and when the
    /// op's own tensors and scratch exceed the budget it is an out_of_memory. The op's tensors,
    /// whose pointers the loop may hold, do not move for it, so free memory they leave in pieces
    /// is an out_of_memory too, one that says so. The plan does not foresee it; scratch an op
    /// needs every iteration is better a transient tensor of kind workspace, which the planner
    /// counts and which is placed with the op's tensors.
    [[nodiscard]] void* workspace(std::uint64_t bytes) const;

   private:
    friend class Session;
    friend class session_impl;
    op_scope(session_impl* s, std::uint32_t index, bool rerun = false) : s_(s), index_(index), rerun_(rerun) {}
    [[nodiscard]] void* raw_ptr(tensor_handle t) const;
    // Whether this scope's op is no longer the open one (Note [Stale scopes] in session.cpp).
    [[nodiscard]] bool stale() const;
    session_impl* s_;
    std::uint32_t index_;
    bool rerun_ = false;  // the scope of a recomputation: the library ends nothing when it goes
    std::uint64_t serial_ = 0;  // Session::op's scopes: which op opened it; 0: a scope the library made
  };
  /// `writes` lists tensors the op overwrites entirely; a tensor it updates in place (+=, Adam)
  /// goes in both lists. `flops` feeds the planner's estimate before durations are measured.
  /// The op's phase, which planners such as vDNN use, comes from its name: one that says
  /// forward/fwd, backward/bwd/grad, or adam/sgd/optim.
  [[nodiscard]] op_scope op(std::string_view name, std::initializer_list<tensor_handle> reads,
                            std::initializer_list<tensor_handle> writes, double flops = 0);
  /// The same, for lists built at run time.
  [[nodiscard]] op_scope op(std::string_view name, std::span<const tensor_handle> reads,
                            std::span<const tensor_handle> writes, double flops = 0);
  /// An op that also adds into `accumulates` (+=, as a backward pass adds into gradients): a
  /// tensor no op of the iteration has touched yet is zero-filled by the library on the op's
  /// stream first; after that it holds what earlier ops left; so a loop that zeroes its
  /// gradients at the start of a step drops that memset (Note [Accumulation] in session_ops.cpp).
  /// A tensor is in `writes` or in `accumulates`, not both.
  [[nodiscard]] op_scope op(std::string_view name, std::initializer_list<tensor_handle> reads,
                            std::initializer_list<tensor_handle> writes,
                            std::initializer_list<tensor_handle> accumulates, double flops = 0);
  /// The same, for lists built at run time.
  [[nodiscard]] op_scope op(std::string_view name, std::span<const tensor_handle> reads,
                            std::span<const tensor_handle> writes, std::span<const tensor_handle> accumulates,
                            double flops = 0);

  /// The body of a recomputable op: launches the op's work through `op` (ptr(), stream(),
  /// workspace(), run()).
  using op_body = std::function<void(const op_scope& op)>;
  /// A recomputable op (Note [Recomputation] in prefetch/plan.hpp): runs `body` once now as op
  /// `name` over `reads` and `writes`, and lets the plan run it again later in this iteration,
  /// before an op that needs what it wrote, instead of keeping or swapping its outputs. A rerun
  /// calls `body` with a scope whose ptr() gives the tensors' device pointers at that time (they
  /// may differ from the first run's). So `body` must depend only on its reads, be
  /// deterministic (the same bits from the same inputs), and capture nothing that changes
  /// before the iteration ends; the Session keeps it until end_iteration(). It writes only
  /// transients (activations, workspaces, metrics), none that it also reads, and accumulates
  /// into nothing; it names no parent split into views (name the views). Any of these is a
  /// usage_error naming the op, before any work. An op given as recomputable in one iteration
  /// and as a plain op() in another is a change of the trace, like a change of its tensors: that
  /// iteration runs on demand and is recorded and planned again. The iteration report counts
  /// the reruns (recomputes).
  void recomputable_op(std::string_view name, std::initializer_list<tensor_handle> reads,
                       std::initializer_list<tensor_handle> writes, const op_body& body, double flops = 0);
  /// The same, for lists built at run time.
  void recomputable_op(std::string_view name, std::span<const tensor_handle> reads,
                       std::span<const tensor_handle> writes, const op_body& body, double flops = 0);

  /// Host code over host pointers to an op's tensors (access.ptr()), for host_capable_op.
  using host_body = std::function<void(const op_scope::host_access& access)>;
  /// An op with a device and a host implementation, such as an optimizer step (Note [Host ops]
  /// in prefetch/plan.hpp): the plan decides where it runs. On the device, `device_body` launches
  /// its work through `op` (ptr(), stream(), workspace(), run()) as in an op() scope. On the host,
  /// `host_body` runs on the calling thread over the host-tier copies of the op's tensors while
  /// the device works through what was enqueued before it; only what device ops also use crosses
  /// the link (gradients down, updated weights up), and tensors only such ops touch (fp32 master
  /// weights, optimizer moments) stay in host memory all along. Both bodies must give the same
  /// bits from the same inputs (kernels/cpu_adam.hpp does, for adam_step). The recording
  /// iteration runs `device_body`; the setting host_ops says what plans may do (auto: the planner
  /// weighs both places; host: every such op it can serve on the host; device: none). `writes`
  /// lists tensors it overwrites entirely, one it updates in place goes in both lists; it names
  /// no parent split into views (name the views). `host_bytes`: the bytes the host body streams
  /// through memory, for the planner's estimate (0: the bytes of its tensors, each list counted).
  void host_capable_op(std::string_view name, std::initializer_list<tensor_handle> reads,
                       std::initializer_list<tensor_handle> writes, const op_body& device_body,
                       const host_body& host_body, double flops = 0, double host_bytes = 0);
  /// The same, for lists built at run time.
  void host_capable_op(std::string_view name, std::span<const tensor_handle> reads,
                       std::span<const tensor_handle> writes, const op_body& device_body,
                       const host_body& host_body, double flops = 0, double host_bytes = 0);

  /// Reports of every finished iteration, in order.
  [[nodiscard]] const std::vector<iteration_report>& history() const noexcept;
  /// The trace the plan of the current (or last) iteration's phase was made from (empty before
  /// that phase's first iteration ends).
  [[nodiscard]] const trace& recorded_trace() const noexcept;
  /// The plan of the current (or last) iteration's phase, or null while it records.
  [[nodiscard]] const plan* current_plan() const noexcept;
  /// Peak live bytes of that phase's recorded iteration with everything resident (0 before it
  /// ends).
  [[nodiscard]] std::uint64_t footprint_bytes() const;
  /// The least device budget any plan can need for the recorded iterations (of every phase):
  /// the largest single-op working set, each tensor rounded up to the budget's 512-byte granule
  /// (0 before the first iteration ends).
  [[nodiscard]] std::uint64_t least_budget_bytes() const;
  /// Writes a Chrome trace (compute, copy and I/O tracks, a device-memory counter with the
  /// budget line) of the iterations run so far. Also written at destruction when the config's
  /// chrome_trace names a file.
  void write_chrome_trace(const std::string& path) const;

 private:
  std::unique_ptr<session_impl> impl_;
};

/// Host pointers to an op's tensors inside op_scope::run.
using host_access = Session::op_scope::host_access;

}  // namespace spillway
