/* Spillway's C API: the Session of offload/swap_policy.hpp for programs written in C (C99 or later).
 * Opaque handles, every name prefixed spw_, every call that can fail returns an spw_status.
 *
 *   spw_session* s;
 *   if (spw_session_from_env(&s) != SPW_OK) { fprintf(stderr, "%s\n", spw_last_error()); return 1; }
 *   spw_tensor w;  spw_add_persistent(s, "fc.weight", bytes, SPW_PARAMETER, init, &w);
 *   for (int step = 0; step < steps; ++step) {
 *     spw_begin_iteration(s, "train");
 *     spw_tensor y;  spw_add_transient(s, "fc.out", y_bytes, SPW_ACTIVATION, &y);
 *     spw_tensor reads[] = {w}, writes[] = {y};
 *     spw_op* op;  spw_op_begin(s, "fc.forward", reads, 1, writes, 1, NULL, 0, &op);
 *     spw_op_run(op, fc_forward_on_host, &args);       // or launch on spw_op_stream(op) with spw_op_ptr
 *     spw_op_end(op);
 *     spw_release(s, y);
 *     spw_iteration_report r;  spw_end_iteration(s, &r);
 *   }
 *   spw_session_destroy(s);
 *
 * Errors. A call that fails returns the kind of the error (one code per exception kind of
 * device/error.hpp) and leaves a message, retrievable on the same thread with spw_last_error()
 * until the next failing call there. Nothing is thrown across this header and nothing is printed.
 * The semantics of each call are those of the Session method of the same name (swap_policy.hpp).
 * A session, like a Session, is used from one thread at a time: a call from another thread while
 * one is inside a call or holds an op open fails with SPW_ERR_USAGE and changes nothing.
 */
#ifndef SPILLWAY_H
#define SPILLWAY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** What a call returned: SPW_OK, or the kind of the error (device/error.hpp). */
typedef enum spw_status {
  SPW_OK = 0,
  SPW_ERR_CONFIG = 1,        /**< bad input: a setting, size, file or checkpoint that does not make sense */
  SPW_ERR_USAGE = 2,         /**< the API called out of order or with something it did not hand out */
  SPW_ERR_IO = 3,            /**< a tier or a file failed */
  SPW_ERR_CORRUPTION = 4,    /**< bytes read back are not the bytes written */
  SPW_ERR_OUT_OF_MEMORY = 5, /**< a request for memory that cannot be met */
  SPW_ERR_CUDA = 6,          /**< the CUDA runtime or one of its libraries failed */
  SPW_ERR_OTHER = 7          /**< anything else (an internal invariant broke, std::bad_alloc, ...) */
} spw_status;

/** Kinds of tensor (tensor_kind): the first three are persistent, the others transient. */
typedef enum spw_kind {
  SPW_PARAMETER = 0,
  SPW_GRADIENT = 1,
  SPW_OPTIMIZER_STATE = 2,
  SPW_ACTIVATION = 3,
  SPW_WORKSPACE = 4,
  SPW_METRIC = 5 /**< a transient the host reads every iteration (a loss): kept on the device */
} spw_kind;

typedef struct spw_session spw_session; /**< a Session */
typedef struct spw_op spw_op;           /**< an open op scope */
typedef struct spw_host spw_host;       /**< host access to an op's tensors, inside spw_op_run */

/** A tensor registered with a session. Plain value: copy it freely. */
typedef struct spw_tensor {
  uint32_t id;
} spw_tensor;

/** What one iteration did (iteration_report and its iteration_counters). */
typedef struct spw_iteration_report {
  uint64_t iteration;           /**< 1-based */
  int planned;                  /**< 1: followed a plan; 0: ran on demand, recording */
  char policy[16];              /**< planner whose plan it followed, NUL-terminated */
  double step_ms;               /**< wall time from begin to end of the iteration */
  double stall_ms;              /**< time ops waited for tensors that were not there in time */
  uint64_t peak_device_bytes;   /**< device memory in use at the worst moment */
  uint64_t h2d_bytes;           /**< bytes copied host to device */
  uint64_t d2h_bytes;           /**< bytes copied device to host */
  uint64_t nvme_read_bytes;
  uint64_t nvme_write_bytes;
  uint64_t on_demand_fetches;   /**< tensors fetched because the plan missed them */
  uint64_t on_demand_evictions; /**< tensors evicted because an allocation would exceed the budget */
  uint64_t prefetches_deferred; /**< planned prefetches that found no room at their op */
  uint64_t recomputes;          /**< runs again of recomputable ops (spw_recomputable_op) */
  uint64_t host_ops;            /**< host-capable ops the plan ran on the host (spw_host_capable_op) */
} spw_iteration_report;

/* ---- errors ------------------------------------------------------------------------------- */

/** The message of the last failing call on this thread ("" when none failed). Valid until the
 *  next failing call on this thread. */
const char* spw_last_error(void);
/** The status of the last failing call on this thread (SPW_OK when none failed). */
spw_status spw_last_status(void);
/** "ok", "config", "usage", "io", "corruption", "out_of_memory", "cuda", "other". */
const char* spw_status_name(spw_status status);

/* ---- sessions ----------------------------------------------------------------------------- */

/** A session with the defaults overridden by every SPILLWAY_* variable set (session_config::from_env). */
spw_status spw_session_from_env(spw_session** out);
/** A session from the keys of a JSON object, such as {"policy": "auto", "device_budget": "1GiB"}. */
spw_status spw_session_from_json_text(const char* json, spw_session** out);
/** A session from a JSON file of settings. */
spw_status spw_session_from_json_file(const char* path, spw_session** out);
/** Closes a session (waits for its work, frees its memory and swap files). NULL is ignored. Any
 *  op still open on it must have been ended first. */
void spw_session_destroy(spw_session* s);

/** The device budget in force, in bytes. */
spw_status spw_device_budget(const spw_session* s, uint64_t* bytes);
/** Changes the device budget between iterations (Session::set_device_budget). */
spw_status spw_set_device_budget(spw_session* s, uint64_t bytes);
/** Peak live bytes of the current (or last) phase's recorded iteration with everything resident
 *  (0 before it ends). */
spw_status spw_footprint_bytes(const spw_session* s, uint64_t* bytes);
/** The least device budget any plan needs for the iterations recorded so far (0 before the first
 *  ends). */
spw_status spw_least_budget_bytes(const spw_session* s, uint64_t* bytes);

/* ---- tensors ------------------------------------------------------------------------------ */

/** A tensor that lives across iterations (SPW_PARAMETER, SPW_GRADIENT, SPW_OPTIMIZER_STATE); its
 *  contents start as `bytes` bytes copied from `initial`, or zero when it is NULL. */
spw_status spw_add_persistent(spw_session* s, const char* name, uint64_t bytes, spw_kind kind, const void* initial,
                              spw_tensor* out);
/** A tensor of the current iteration (SPW_ACTIVATION, SPW_WORKSPACE, SPW_METRIC); its first op
 *  writes or accumulates it; release it after its last use. */
spw_status spw_add_transient(spw_session* s, const char* name, uint64_t bytes, spw_kind kind, spw_tensor* out);
/** A view: the bytes [offset, offset + bytes) of a persistent tensor, named `name` (NULL or "":
 *  "PARENT[offset:end]"). Added outside an iteration, before any op or read names the parent. */
spw_status spw_add_view(spw_session* s, spw_tensor parent, uint64_t offset, uint64_t bytes, const char* name,
                        spw_tensor* out);
/** Ends a transient's life in this iteration. */
spw_status spw_release(spw_session* s, spw_tensor t);
/** Copies a tensor's current contents (`bytes`, its size) to host memory. Between iterations, a
 *  metric the last iteration wrote and did not release gives its last value (Session::read). */
spw_status spw_read(spw_session* s, spw_tensor t, void* host, uint64_t bytes);
/** Replaces a persistent tensor's contents with `bytes` (its size) from host memory, between
 *  iterations. */
spw_status spw_write(spw_session* s, spw_tensor t, const void* host, uint64_t bytes);

/* ---- iterations --------------------------------------------------------------------------- */

/** Starts an iteration of the phase `tag` (NULL: "train"). */
spw_status spw_begin_iteration(spw_session* s, const char* tag);
/** Ends the iteration and fills `report` when it is not NULL. */
spw_status spw_end_iteration(spw_session* s, spw_iteration_report* report);
/** Gives up the current iteration, if any, as a failed one, for a loop that skips a step its own
 *  code could not finish (end its open op first): nothing is planned or reported from it, and
 *  each tensor holds its value from before the step or what the step's ops made of it. A call
 *  that failed inside the iteration already marked it failed: the next spw_begin_iteration ends
 *  it the same way. From another thread than the one inside a call or holding an op open it
 *  fails with SPW_ERR_USAGE and changes nothing. */
spw_status spw_abandon_iteration(spw_session* s);

/* ---- ops ---------------------------------------------------------------------------------- */

/** Opens an op: `reads` are tensors whose contents it needs, `writes` those it overwrites
 *  entirely (one it updates in place goes in both), `accumulates` those it adds into (+=; the
 *  first accumulation of an iteration finds the tensor zero-filled). A list may be NULL when its
 *  count is 0. Inside the op (until spw_op_end) its tensors are resident. On success *out must be
 *  ended with spw_op_end; on failure no op is open. */
spw_status spw_op_begin(spw_session* s, const char* name, const spw_tensor* reads, size_t n_reads,
                        const spw_tensor* writes, size_t n_writes, const spw_tensor* accumulates,
                        size_t n_accumulates, spw_op** out);
/** Ends the op and frees `op`, whatever it returns (ending may fail, e.g. with no room to swap out). */
spw_status spw_op_end(spw_op* op);
/** Device pointer of a tensor the op names. */
spw_status spw_op_ptr(const spw_op* op, spw_tensor t, void** out);
/** The stream to launch the op's device work on: the cudaStream_t on the cuda backend; on the cpu
 *  backend an opaque handle that CUDA must not be given. NULL only for a NULL op. */
void* spw_op_stream(const spw_op* op);
/** A seed for the op's random draws (a dropout mask), the same at its first run and at every rerun,
 *  other for every other op and iteration (op_scope::seed): a recomputable op seeds a
 *  counter-based generator with it, so a rerun draws what the first run drew. Iterations are
 *  numbered by those ended, so a failed step run again draws what its failed attempt drew. 0 only
 *  for a NULL op. */
uint64_t spw_op_seed(const spw_op* op);
/** The stream every op's spw_op_stream is, for the session's life (Session::stream): a loop that
 *  gives its library handles a stream once, at its start, gives them this one. On CUDA, work
 *  launched with no stream inside an op is ordered with it too. NULL only for a NULL session. */
void* spw_session_stream(const spw_session* s);
/** `bytes` of device scratch for this op, valid on its stream until spw_op_end. */
spw_status spw_op_workspace(const spw_op* op, uint64_t bytes, void** out);
/** Runs `fn(h, user)` on the host in stream order, with host pointers to the op's tensors
 *  (spw_host_ptr): plain C over arrays runs unchanged in there. Returns when `fn` has run. `fn`
 *  may run on another thread than the caller's; it must not call any spw_ function but
 *  spw_host_ptr. On the cpu backend the pointers are the device memory itself; on a GPU they are
 *  host copies, copied back after `fn` for the tensors the op writes or accumulates. */
spw_status spw_op_run(spw_op* op, void (*fn)(const spw_host* h, void* user), void* user);
/** Inside spw_op_run: the host pointer of a tensor the op names. For a tensor the op does not
 *  name it returns NULL, and spw_op_run then returns SPW_ERR_USAGE with the message. */
void* spw_host_ptr(const spw_host* h, spw_tensor t);

/* ---- ops the plan may run again, or run on the host ------------------------------------- */

/** The device side of a recomputable or host-capable op: launches the op's work through `op`
 *  (spw_op_ptr, spw_op_stream, spw_op_workspace, spw_op_run) and returns SPW_OK, or a failure:
 *  the status an spw_ call returned (its message stays with it) or a code of its own. A failure
 *  fails the op as an exception from a C++ body does. `op` is the library's for the body's run:
 *  the body must not spw_op_end it nor keep it. */
typedef spw_status (*spw_op_body)(spw_op* op, void* user);
/** The host side of a host-capable op: host code over host pointers to its tensors (spw_host_ptr). */
typedef void (*spw_host_body)(const spw_host* h, void* user);

/** A recomputable op (Session::recomputable_op): runs body(op, user) once now, as op `name` over
 *  `reads` and `writes`, and lets the plan run it again later in this iteration, before an op that
 *  needs what it wrote, instead of keeping or swapping that. So the body must depend only on its
 *  reads and give the same bits every time; it writes only transients, none that it also reads;
 *  `user`, and what the body reads through it, must stay valid and unchanged until
 *  spw_end_iteration. A breach of these rules that the library can see is SPW_ERR_USAGE naming
 *  the op, before any work. `flops` feeds the planner's estimate (0: unknown). */
spw_status spw_recomputable_op(spw_session* s, const char* name, const spw_tensor* reads, size_t n_reads,
                               const spw_tensor* writes, size_t n_writes, spw_op_body body, void* user,
                               double flops);
/** An op with a device and a host implementation, such as an optimizer step
 *  (Session::host_capable_op): the plan decides where it runs, device_body(op, user) on the device
 *  or host_body(h, user) on the calling thread over the host-tier copies of its tensors. Both must
 *  give the same bits from the same inputs. `writes` lists what it overwrites; a tensor it updates
 *  in place goes in both lists. `host_bytes`: the bytes host_body streams through memory (0: its
 *  tensors' bytes). */
spw_status spw_host_capable_op(spw_session* s, const char* name, const spw_tensor* reads, size_t n_reads,
                               const spw_tensor* writes, size_t n_writes, spw_op_body device_body,
                               spw_host_body host_body, void* user, double flops, double host_bytes);

/* ---- checkpoints -------------------------------------------------------------------------- */

/** Writes every persistent tensor to directory `dir` with `meta_len` bytes of `meta` (the loop's
 *  own state; NULL when meta_len is 0) beside them, and the count of iterations ended, which
 *  numbers spw_op_seed. Outside an iteration. */
spw_status spw_save(spw_session* s, const char* dir, const void* meta, size_t meta_len);
/** Loads a checkpoint spw_save wrote into the registered persistent tensors, and counts the
 *  iterations on from the saved count (spw_op_seed goes on as in the run that saved). Its meta is
 *  copied to `meta` (at most `capacity` bytes; NUL-terminated when there is room) and its full
 *  length stored in *meta_len when meta_len is not NULL; `meta` may be NULL when capacity is 0. */
spw_status spw_load(spw_session* s, const char* dir, void* meta, size_t capacity, size_t* meta_len);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPILLWAY_H */
