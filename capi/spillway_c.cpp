// The C API (capi/spillway.h) over the Session: handles are the C++ objects behind opaque
// pointers, and every exception stops at this file's boundary as an spw_status and a message.
#include "capi/spillway.h"

#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <exception>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "offload/swap_policy.hpp"

struct spw_session {
  explicit spw_session(spillway::session_config config) : session(std::move(config)) {}
  spillway::Session session;
};

// An op: spw_op_begin's owns its scope; the op a body of spw_recomputable_op or
// spw_host_capable_op is given borrows the library's scope for the body's run.
// Every spw_op is in `live_ops` while it exists (Note [Live ops]).
struct spw_op {
  explicit spw_op(spillway::Session::op_scope&& own) : owned(std::move(own)), scope(&*owned) { enter(); }
  explicit spw_op(const spillway::Session::op_scope& borrowed) : scope(&borrowed) { enter(); }
  ~spw_op();
  spw_op(const spw_op&) = delete;
  spw_op& operator=(const spw_op&) = delete;
  void enter();
  std::optional<spillway::Session::op_scope> owned;
  const spillway::Session::op_scope* scope;
};

// Inside spw_op_run: the C++ host access, and the first failure spw_host_ptr met (it must not
// throw through the caller's C frames), rethrown when the callback returns.
struct spw_host {
  const spillway::Session::op_scope::host_access* access;
  mutable std::exception_ptr failure;
};

namespace {

// Note [Live ops]
// spw_op_end frees its op, so a second spw_op_end of it (a cleanup path that ends whatever it
// thinks is open) read freed memory, and once the block was handed out again, freed the
// program's own memory and returned SPW_OK. Every spw_op the library makes is kept in a set
// while it is open, and each call taking an op looks it up first: an op that has ended is
// refused with SPW_ERR_USAGE. One lookup under a mutex per call; an op's calls are few. An ended
// op's block is not freed at once: the allocator would hand the same address to the next
// spw_op_begin, and a stale end would then end that op. The last `quarantined_ops` ended ops
// are kept, closed, and the oldest freed as others end, so a repeated end is caught as long as
// fewer ops than that began since.
constexpr std::size_t quarantined_ops = 64;
std::mutex live_ops_mutex;
std::unordered_set<const spw_op*> live_ops;
// The ended ops kept closed, oldest first; those left at exit are freed then (a leak checker
// would count them otherwise: the deque's own memory goes with the program's globals).
struct quarantine {
  std::deque<spw_op*> ops;
  quarantine() = default;
  quarantine(const quarantine&) = delete;
  quarantine& operator=(const quarantine&) = delete;
  ~quarantine();
};
quarantine ended_ops;

// How deep this thread is inside a host function of spw_op_run or a host-capable op's host
// body. An op ended there waited for the call that runs the function to return: a hang.
thread_local int in_host_function = 0;

struct host_function_scope {
  host_function_scope() { ++in_host_function; }
  ~host_function_scope() { --in_host_function; }
  host_function_scope(const host_function_scope&) = delete;
  host_function_scope& operator=(const host_function_scope&) = delete;
};

bool is_live(const spw_op* op) {
  std::lock_guard lock(live_ops_mutex);
  return live_ops.count(op) != 0;
}

// Closes an ended op and keeps its block a while (Note [Live ops]).
void retire(spw_op* op) {
  spw_op* oldest = nullptr;
  {
    std::lock_guard lock(live_ops_mutex);
    live_ops.erase(op);
    ended_ops.ops.push_back(op);
    if (ended_ops.ops.size() > quarantined_ops) {
      oldest = ended_ops.ops.front();
      ended_ops.ops.pop_front();
    }
  }
  delete oldest;  // its destructor takes the lock
}

}  // namespace

void spw_op::enter() {
  std::lock_guard lock(live_ops_mutex);
  live_ops.insert(this);
}

spw_op::~spw_op() {
  std::lock_guard lock(live_ops_mutex);
  live_ops.erase(this);
}

namespace {
quarantine::~quarantine() {
  for (spw_op* op : ops) delete op;  // each takes the lock, which outlives this (defined before it)
}
}  // namespace

namespace {



struct last_error_state {
  spw_status status = SPW_OK;
  std::string message;
  std::exception_ptr exception;  // the exception behind it, if one was (Note [Body failures])
  std::uint64_t count = 0;       // failing calls so far on this thread
};
thread_local last_error_state last_error;

spw_status fail(spw_status status, const char* message, std::exception_ptr exception = nullptr) {
  last_error.status = status;
  last_error.message = message;
  last_error.exception = std::move(exception);
  ++last_error.count;
  return status;
}

// The current exception as a status and a message. The order matters: corruption_error is an
// io_error, and every kind is a spillway::error.
spw_status from_current_exception() {
  try {
    throw;
  } catch (const spillway::corruption_error& e) {
    return fail(SPW_ERR_CORRUPTION, e.what(), std::current_exception());
  } catch (const spillway::io_error& e) {
    return fail(SPW_ERR_IO, e.what(), std::current_exception());
  } catch (const spillway::config_error& e) {
    return fail(SPW_ERR_CONFIG, e.what(), std::current_exception());
  } catch (const spillway::usage_error& e) {
    return fail(SPW_ERR_USAGE, e.what(), std::current_exception());
  } catch (const spillway::out_of_memory& e) {
    return fail(SPW_ERR_OUT_OF_MEMORY, e.what(), std::current_exception());
  } catch (const spillway::cuda_error& e) {
    return fail(SPW_ERR_CUDA, e.what(), std::current_exception());
  } catch (const std::bad_alloc& e) {
    return fail(SPW_ERR_OUT_OF_MEMORY, (std::string("host memory: ") + e.what()).c_str(), std::current_exception());
  } catch (const std::exception& e) {
    return fail(SPW_ERR_OTHER, e.what(), std::current_exception());
  } catch (...) {
    return fail(SPW_ERR_OTHER, "an exception that is not a std::exception", std::current_exception());
  }
}

// Runs `f`, turning whatever it throws into a status.
template <class F>
spw_status guarded(F&& f) noexcept {
  try {
    f();
    return SPW_OK;
  } catch (...) {
    return from_current_exception();
  }
}

// The refusal of a call on an op that has ended (Note [Live ops]).
spw_status ended_op(const char* call) {
  return fail(SPW_ERR_USAGE, (std::string(call) + ": the op has ended (spw_op_end was called for it, or its body "
                                                  "returned); begin a new op with spw_op_begin")
                                 .c_str());
}

spw_status null_argument(const char* call, const char* what) {
  return fail(SPW_ERR_USAGE, (std::string(call) + ": " + what + " is NULL").c_str());
}

// Note [Body failures]
// A body of spw_recomputable_op or spw_host_capable_op is C: it reports a failure as a status,
// and the Session above it needs the exception a C++ body would throw, so that the op fails
// the same way and the caller's call (or the later op whose rerun ran the body) returns the
// same status and message. When the failure is what an spw_ call inside the body returned, the
// exception behind it is thrown again as it was; a code of the body's own becomes the error
// kind it names, with a message naming the op.
[[noreturn]] void throw_status(spw_status status, const std::string& op, std::uint64_t failures_before) {
  if (last_error.count != failures_before && last_error.status == status) {
    if (last_error.exception) std::rethrow_exception(last_error.exception);
    throw spillway::usage_error(last_error.message);  // an argument an spw_ call refused (null_argument)
  }
  const std::string what = "op \"" + op + "\": its body returned the status " + spw_status_name(status) +
                           " (its own: no spw_ call in it failed)";
  switch (status) {
    case SPW_ERR_CONFIG: throw spillway::config_error(what);
    case SPW_ERR_USAGE: throw spillway::usage_error(what);
    case SPW_ERR_IO: throw spillway::io_error(what, 0);
    case SPW_ERR_CORRUPTION: throw spillway::corruption_error(what);
    case SPW_ERR_OUT_OF_MEMORY: throw spillway::out_of_memory(what);
    case SPW_ERR_CUDA: throw spillway::cuda_error(what);
    default: throw std::runtime_error(what);
  }
}

// A C body as the Session's op_body: its op borrows the scope the library gives it.
spillway::Session::op_body device_body(const char* name, spw_op_body body, void* user) {
  return [op_name = std::string(name), body, user](const spillway::Session::op_scope& scope) {
    spw_op op(scope);
    const std::uint64_t before = last_error.count;
    const spw_status status = body(&op, user);
    if (status != SPW_OK) throw_status(status, op_name, before);
  };
}

spillway::tensor_handle handle(spw_tensor t) { return spillway::tensor_handle{t.id}; }
spw_tensor to_c(spillway::tensor_handle t) { return spw_tensor{t.id}; }

// A kind as the caller passed it. C lets any int through an spw_kind, and in C++ reading one
// outside the enumerators is undefined, so its bytes are read as an int.
int kind_value(const spw_kind& k) {
  static_assert(sizeof(spw_kind) == sizeof(int));
  int v;
  std::memcpy(&v, &k, sizeof v);
  return v;
}

spillway::tensor_kind checked_kind(const char* call, const spw_kind& k) {
  switch (kind_value(k)) {
    case SPW_PARAMETER: return spillway::tensor_kind::parameter;
    case SPW_GRADIENT: return spillway::tensor_kind::gradient;
    case SPW_OPTIMIZER_STATE: return spillway::tensor_kind::optimizer_state;
    case SPW_ACTIVATION: return spillway::tensor_kind::activation;
    case SPW_WORKSPACE: return spillway::tensor_kind::workspace;
    case SPW_METRIC: return spillway::tensor_kind::metric;
    default: throw spillway::usage_error(std::string(call) + ": " + std::to_string(kind_value(k)) + " is not an spw_kind");
  }
}

std::vector<spillway::tensor_handle> handles(const char* call, const char* list, const spw_tensor* ts, size_t n) {
  if (n > 0 && ts == nullptr)
    throw spillway::usage_error(std::string(call) + ": " + list + " is NULL with a count of " + std::to_string(n));
  std::vector<spillway::tensor_handle> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(handle(ts[i]));
  return out;
}

spw_status open_session(spw_session** out, const char* call, spillway::session_config (*load)(const char*),
                        const char* arg) {
  if (out == nullptr) return null_argument(call, "out");
  *out = nullptr;
  return guarded([&] { *out = new spw_session(load(arg)); });
}

}  // namespace

extern "C" {

const char* spw_last_error(void) { return last_error.message.c_str(); }
spw_status spw_last_status(void) { return last_error.status; }

const char* spw_status_name(spw_status status) {
  static_assert(sizeof(spw_status) == sizeof(int));
  int v;  // read as an int, as kind_value does: a C caller may pass any int
  std::memcpy(&v, &status, sizeof v);
  switch (v) {
    case SPW_OK: return "ok";
    case SPW_ERR_CONFIG: return "config";
    case SPW_ERR_USAGE: return "usage";
    case SPW_ERR_IO: return "io";
    case SPW_ERR_CORRUPTION: return "corruption";
    case SPW_ERR_OUT_OF_MEMORY: return "out_of_memory";
    case SPW_ERR_CUDA: return "cuda";
    case SPW_ERR_OTHER: return "other";
  }
  return "unknown";
}

spw_status spw_session_from_env(spw_session** out) {
  return open_session(out, "spw_session_from_env", [](const char*) { return spillway::session_config::from_env(); },
                      nullptr);
}

spw_status spw_session_from_json_text(const char* json, spw_session** out) {
  if (json == nullptr) return null_argument("spw_session_from_json_text", "json");
  return open_session(out, "spw_session_from_json_text",
                      [](const char* text) { return spillway::session_config::from_json_text(text); }, json);
}

spw_status spw_session_from_json_file(const char* path, spw_session** out) {
  if (path == nullptr) return null_argument("spw_session_from_json_file", "path");
  return open_session(out, "spw_session_from_json_file",
                      [](const char* p) { return spillway::session_config::from_json_file(p); }, path);
}

void spw_session_destroy(spw_session* s) { delete s; }

spw_status spw_device_budget(const spw_session* s, uint64_t* bytes) {
  if (s == nullptr || bytes == nullptr) return null_argument("spw_device_budget", s == nullptr ? "the session" : "bytes");
  *bytes = s->session.device_budget();
  return SPW_OK;
}

spw_status spw_set_device_budget(spw_session* s, uint64_t bytes) {
  if (s == nullptr) return null_argument("spw_set_device_budget", "the session");
  return guarded([&] { s->session.set_device_budget(bytes); });
}

spw_status spw_footprint_bytes(const spw_session* s, uint64_t* bytes) {
  if (s == nullptr || bytes == nullptr) return null_argument("spw_footprint_bytes", s == nullptr ? "the session" : "bytes");
  return guarded([&] { *bytes = s->session.footprint_bytes(); });
}

spw_status spw_least_budget_bytes(const spw_session* s, uint64_t* bytes) {
  if (s == nullptr || bytes == nullptr)
    return null_argument("spw_least_budget_bytes", s == nullptr ? "the session" : "bytes");
  return guarded([&] { *bytes = s->session.least_budget_bytes(); });
}

spw_status spw_add_persistent(spw_session* s, const char* name, uint64_t bytes, spw_kind kind, const void* initial,
                              spw_tensor* out) {
  constexpr const char* call = "spw_add_persistent";
  if (s == nullptr || name == nullptr || out == nullptr)
    return null_argument(call, s == nullptr ? "the session" : name == nullptr ? "name" : "out");
  return guarded([&] { *out = to_c(s->session.add_persistent(name, bytes, checked_kind(call, kind), initial)); });
}

spw_status spw_add_transient(spw_session* s, const char* name, uint64_t bytes, spw_kind kind, spw_tensor* out) {
  constexpr const char* call = "spw_add_transient";
  if (s == nullptr || name == nullptr || out == nullptr)
    return null_argument(call, s == nullptr ? "the session" : name == nullptr ? "name" : "out");
  return guarded([&] { *out = to_c(s->session.add_transient(name, bytes, checked_kind(call, kind))); });
}

spw_status spw_add_view(spw_session* s, spw_tensor parent, uint64_t offset, uint64_t bytes, const char* name,
                        spw_tensor* out) {
  if (s == nullptr || out == nullptr) return null_argument("spw_add_view", s == nullptr ? "the session" : "out");
  return guarded([&] { *out = to_c(s->session.add_view(handle(parent), offset, bytes, name == nullptr ? "" : name)); });
}

spw_status spw_release(spw_session* s, spw_tensor t) {
  if (s == nullptr) return null_argument("spw_release", "the session");
  return guarded([&] { s->session.release(handle(t)); });
}

spw_status spw_read(spw_session* s, spw_tensor t, void* host, uint64_t bytes) {
  if (s == nullptr || host == nullptr) return null_argument("spw_read", s == nullptr ? "the session" : "host");
  return guarded([&] { s->session.read(handle(t), host, bytes); });
}

spw_status spw_write(spw_session* s, spw_tensor t, const void* host, uint64_t bytes) {
  if (s == nullptr || host == nullptr) return null_argument("spw_write", s == nullptr ? "the session" : "host");
  return guarded([&] { s->session.write(handle(t), host, bytes); });
}

spw_status spw_begin_iteration(spw_session* s, const char* tag) {
  if (s == nullptr) return null_argument("spw_begin_iteration", "the session");
  return guarded([&] { s->session.begin_iteration(tag == nullptr ? "train" : tag); });
}

spw_status spw_end_iteration(spw_session* s, spw_iteration_report* report) {
  if (s == nullptr) return null_argument("spw_end_iteration", "the session");
  return guarded([&] {
    const spillway::iteration_report r = s->session.end_iteration();
    if (report == nullptr) return;
    *report = spw_iteration_report{};
    report->iteration = r.iteration;
    report->planned = r.planned ? 1 : 0;
    std::strncpy(report->policy, r.policy.c_str(), sizeof report->policy - 1);
    report->step_ms = r.step_ms;
    report->stall_ms = r.stall_ms;
    report->peak_device_bytes = r.peak_device_bytes;
    report->h2d_bytes = r.h2d_bytes;
    report->d2h_bytes = r.d2h_bytes;
    report->nvme_read_bytes = r.nvme_read_bytes;
    report->nvme_write_bytes = r.nvme_write_bytes;
    report->on_demand_fetches = r.on_demand_fetches;
    report->on_demand_evictions = r.on_demand_evictions;
    report->prefetches_deferred = r.prefetches_deferred;
    report->recomputes = r.recomputes;
    report->host_ops = r.host_ops;
  });
}

spw_status spw_abandon_iteration(spw_session* s) {
  if (s == nullptr) return null_argument("spw_abandon_iteration", "the session");
  if (!s->session.abandon_iteration())
    return fail(SPW_ERR_USAGE, "spw_abandon_iteration: another thread is inside a call of this session or holds an op "
                               "open, and the step is that thread's to end; call it from that thread");
  return SPW_OK;
}

spw_status spw_op_begin(spw_session* s, const char* name, const spw_tensor* reads, size_t n_reads,
                        const spw_tensor* writes, size_t n_writes, const spw_tensor* accumulates,
                        size_t n_accumulates, spw_op** out) {
  constexpr const char* call = "spw_op_begin";
  if (s == nullptr || name == nullptr || out == nullptr)
    return null_argument(call, s == nullptr ? "the session" : name == nullptr ? "name" : "out");
  *out = nullptr;
  return guarded([&] {
    const auto r = handles(call, "reads", reads, n_reads);
    const auto w = handles(call, "writes", writes, n_writes);
    const auto a = handles(call, "accumulates", accumulates, n_accumulates);
    *out = new spw_op(s->session.op(name, std::span<const spillway::tensor_handle>(r),
                                    std::span<const spillway::tensor_handle>(w),
                                    std::span<const spillway::tensor_handle>(a)));
  });
}

spw_status spw_op_end(spw_op* op) {
  if (op == nullptr) return null_argument("spw_op_end", "op");
  if (!is_live(op)) return ended_op("spw_op_end");
  if (in_host_function > 0)
    return fail(SPW_ERR_USAGE, "spw_op_end inside the function spw_op_run runs (or a host body): the op ends only after "
                               "it returns; return from the function, then call spw_op_end");
  if (!op->owned)
    return fail(SPW_ERR_USAGE, "spw_op_end: the op of a recomputable or host-capable op's body, which the library "
                               "ends when the body returns; return from the body instead");
  // The scope's destructor ends the op and may throw; `op` is freed either way. The scope is
  // moved out first and ends here, inside guarded: destroyed inside std::optional (whose reset
  // is noexcept) or inside spw_op's implicit noexcept destructor, a throw would terminate.
  return guarded([&] {
    spillway::Session::op_scope scope = std::move(*op->owned);
    op->owned.reset();  // a moved-from scope's end does nothing
    retire(op);
  });
}

spw_status spw_op_ptr(const spw_op* op, spw_tensor t, void** out) {
  if (op == nullptr || out == nullptr) return null_argument("spw_op_ptr", op == nullptr ? "op" : "out");
  if (!is_live(op)) return ended_op("spw_op_ptr");
  return guarded([&] { *out = op->scope->ptr(handle(t)); });
}

void* spw_op_stream(const spw_op* op) { return op == nullptr || !is_live(op) ? nullptr : op->scope->stream().handle; }
uint64_t spw_op_seed(const spw_op* op) {
  try {
    return op == nullptr || !is_live(op) ? 0 : op->scope->seed();
  } catch (...) {  // a scope moved from, which a spw_op never holds
    return 0;
  }
}
void* spw_session_stream(const spw_session* s) { return s == nullptr ? nullptr : s->session.stream().handle; }

spw_status spw_op_workspace(const spw_op* op, uint64_t bytes, void** out) {
  if (op == nullptr || out == nullptr) return null_argument("spw_op_workspace", op == nullptr ? "op" : "out");
  if (!is_live(op)) return ended_op("spw_op_workspace");
  return guarded([&] { *out = op->scope->workspace(bytes); });
}

spw_status spw_op_run(spw_op* op, void (*fn)(const spw_host* h, void* user), void* user) {
  if (op == nullptr || fn == nullptr) return null_argument("spw_op_run", op == nullptr ? "op" : "fn");
  if (!is_live(op)) return ended_op("spw_op_run");
  return guarded([&] {
    op->scope->run([&](const spillway::Session::op_scope::host_access& access) {
      spw_host h{&access, nullptr};
      const host_function_scope inside;
      fn(&h, user);
      if (h.failure) std::rethrow_exception(h.failure);
    });
  });
}

void* spw_host_ptr(const spw_host* h, spw_tensor t) {
  if (h == nullptr) return nullptr;
  try {
    return h->access->ptr(handle(t));
  } catch (...) {
    if (!h->failure) h->failure = std::current_exception();
    return nullptr;
  }
}

spw_status spw_recomputable_op(spw_session* s, const char* name, const spw_tensor* reads, size_t n_reads,
                               const spw_tensor* writes, size_t n_writes, spw_op_body body, void* user,
                               double flops) {
  constexpr const char* call = "spw_recomputable_op";
  if (s == nullptr || name == nullptr || body == nullptr)
    return null_argument(call, s == nullptr ? "the session" : name == nullptr ? "name" : "body");
  return guarded([&] {
    const auto r = handles(call, "reads", reads, n_reads);
    const auto w = handles(call, "writes", writes, n_writes);
    s->session.recomputable_op(name, std::span<const spillway::tensor_handle>(r),
                               std::span<const spillway::tensor_handle>(w), device_body(name, body, user), flops);
  });
}

spw_status spw_host_capable_op(spw_session* s, const char* name, const spw_tensor* reads, size_t n_reads,
                               const spw_tensor* writes, size_t n_writes, spw_op_body device_side,
                               spw_host_body host_side, void* user, double flops, double host_bytes) {
  constexpr const char* call = "spw_host_capable_op";
  if (s == nullptr || name == nullptr || device_side == nullptr || host_side == nullptr)
    return null_argument(call, s == nullptr ? "the session" : name == nullptr ? "name"
                               : device_side == nullptr ? "device_body" : "host_body");
  return guarded([&] {
    const auto r = handles(call, "reads", reads, n_reads);
    const auto w = handles(call, "writes", writes, n_writes);
    s->session.host_capable_op(
        name, std::span<const spillway::tensor_handle>(r), std::span<const spillway::tensor_handle>(w),
        device_body(name, device_side, user),
        [host_side, user](const spillway::Session::op_scope::host_access& access) {
          spw_host h{&access, nullptr};
          const host_function_scope inside;
          host_side(&h, user);
          if (h.failure) std::rethrow_exception(h.failure);
        },
        flops, host_bytes);
  });
}

spw_status spw_save(spw_session* s, const char* dir, const void* meta, size_t meta_len) {
  if (s == nullptr || dir == nullptr) return null_argument("spw_save", s == nullptr ? "the session" : "dir");
  if (meta == nullptr && meta_len > 0) return null_argument("spw_save", "meta (with a length above 0)");
  return guarded([&] {
    s->session.save(dir, meta_len == 0 ? std::string_view() : std::string_view(static_cast<const char*>(meta), meta_len));
  });
}

spw_status spw_load(spw_session* s, const char* dir, void* meta, size_t capacity, size_t* meta_len) {
  if (s == nullptr || dir == nullptr) return null_argument("spw_load", s == nullptr ? "the session" : "dir");
  if (meta == nullptr && capacity > 0) return null_argument("spw_load", "meta (with a capacity above 0)");
  return guarded([&] {
    const std::string m = s->session.load(dir);
    if (meta_len != nullptr) *meta_len = m.size();
    if (capacity == 0) return;
    const size_t n = m.size() < capacity ? m.size() : capacity;
    std::memcpy(meta, m.data(), n);
    if (n < capacity) static_cast<char*>(meta)[n] = '\0';
  });
}

}  // extern "C"
