// Session: the swap-policy header's implementation. Owns the device, the arena over the device
// budget, the tiers and the executor; records iteration 1, plans, and follows the plan afterwards.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>

#include "offload/session_call.hpp"
#include "offload/session_impl.hpp"

namespace spillway {

namespace session_detail {
// Note [Sizing the NVMe tier]
// nvme.reserve 0 means "sized from the plan". Before a plan exists the tier holds only
// initial_nvme_reserve and grows on demand (iteration 1 evicts on demand when the host tier is
// full). The planner is told what the swap directories' file systems have free
// (nvme_tier::reservable_bytes), and once a plan is made the tier grows, before the plan runs,
// to what the plan places on NVMe, each tensor rounded as the tier stores it (whole blocks over
// the striped files: at most block_size x files more per tensor). That rounding is the only
// margin: the sum is an upper bound for the plan, and what the executor evicts beyond the plan
// grows the tier when it happens. A full disk is thus an error when the plan is made, not in
// the middle of an iteration. A non-zero nvme.reserve is reserved at start and is all there is;
// the planner is given exactly that, and a plan whose sum exceeds it is a config_error when it is
// made (the planner counts tensor bytes, the tier whole blocks: small tensors take far more).

/// Bytes the plan may keep on the NVMe tier at once, as the tier with options `o` stores them.
std::uint64_t nvme_bytes_of(const plan& p, const trace& t, const nvme_options& o) {
  std::vector<bool> on_nvme(t.tensors.size(), false);
  for (std::size_t i = 0; i < p.initial_tier.size() && i < on_nvme.size(); ++i)
    if (p.initial_tier[i] == tier::nvme) on_nvme[i] = true;
  for (const auto& step : p.steps) {
    for (const auto& e : step.evictions)
      if (e.action == evict_action::evict_to_nvme) on_nvme[e.tensor] = true;
    for (const auto& f : step.prefetches)
      if (f.from == tier::nvme) on_nvme[f.tensor] = true;
  }
  const std::uint64_t stripe = std::uint64_t{o.block_size} * o.directories.size();
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < on_nvme.size(); ++i)
    if (on_nvme[i]) sum += round_up(t.tensors[i].bytes, stripe);
  return sum;
}

// Note [Sizing the host tier]
// A non-zero host_budget caps the host tier, and the planner is told so: what does not fit goes
// to NVMe where there is a swap directory (the executor sends there what the full host tier does
// not take). Two things still need the host tier itself:
//  - with no NVMe tier, everything the plan keeps off the device: the plan is simulated when it
//    is made, and its peak in the host tier is what it needs;
//  - the ops a plan runs on the host read and write their tensors in the host tier, never on
//    NVMe: the tensors only they touch stay there all along, and each op needs its others there
//    while it runs.
// A plan that needs more than host_budget would fail in the middle of a later iteration ("host
// tier: out of memory"); it is a config_error when it is made, that says what would fit.
// Iteration 1, before any plan, may still fill the tier on demand; that error says what to
// change too.

namespace {
/// What the host tier must hold for the ops `p` runs on the host (Note [Sizing the host tier]).
std::uint64_t host_op_bytes(const trace& t, const plan& p) {
  std::vector<char> on_host_only(t.tensors.size(), 1), touched(t.tensors.size(), 0);
  for (std::size_t k = 0; k < t.ops.size() && k < p.steps.size(); ++k)
    for (const auto& ids : {t.ops[k].reads, t.ops[k].writes})
      for (auto x : ids) {
        touched[x] = 1;
        if (!p.steps[k].on_host) on_host_only[x] = 0;
      }
  std::uint64_t resident = 0, widest = 0;
  for (std::size_t x = 0; x < t.tensors.size(); ++x)
    if (touched[x] && on_host_only[x]) resident += t.tensors[x].bytes;
  for (std::size_t k = 0; k < t.ops.size() && k < p.steps.size(); ++k) {
    if (!p.steps[k].on_host) continue;
    std::vector<tensor_id> ids = t.ops[k].reads;
    ids.insert(ids.end(), t.ops[k].writes.begin(), t.ops[k].writes.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::uint64_t shared = 0;
    for (auto x : ids)
      if (!on_host_only[x]) shared += t.tensors[x].bytes;
    widest = std::max(widest, shared);
  }
  return resident + widest;
}
}  // namespace

void check_host_tier(const trace& t, const offload::lifetime_report& r, const plan& p, const offload::hw_profile& hw,
                     const session_config& cfg, bool have_nvme) {
  if (cfg.host_budget == 0) return;
  const std::size_t host_ops = p.host_op_count();
  if (have_nvme && host_ops == 0) return;
  const std::uint64_t need = have_nvme ? host_op_bytes(t, p) : offload::simulate(t, r, p, hw).peak_host_bytes;
  if (need <= cfg.host_budget) return;
  std::string fixes = "give host_budget of at least " + format_bytes_at_least(need) + ", or 0 for no limit";
  if (!have_nvme) fixes += ", or an NVMe swap directory (nvme.directories) for what leaves the device";
  if (host_ops > 0) fixes += ", or host_ops = device to keep the steps on the device";
  throw config_error("host_budget: " + format_bytes(cfg.host_budget) + ", but the plan for budget " +
                     format_bytes(p.budget_bytes) + " needs up to " + format_bytes(need) + " in the host tier at once" +
                     (have_nvme ? " for the " + std::to_string(host_ops) +
                                      " ops it runs on the host, which keep their tensors there, never on NVMe"
                                : std::string()) +
                     "; " + fixes);
}

/// The phase of an op from its name, for planners that act on phases (vDNN): names that say
/// forward/fwd, backward/bwd/grad, or adam/sgd/optim/step. Anything else is "other".
op_phase phase_from_name(std::string_view name) {
  std::string n(name);
  for (auto& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto has = [&](const char* w) { return n.find(w) != std::string::npos; };
  if (has("backward") || has("bwd") || has("grad")) return op_phase::backward;
  if (has("forward") || has("fwd")) return op_phase::forward;
  if (has("adam") || has("sgd") || has("optim")) return op_phase::optimizer;
  return op_phase::other;
}

std::string planner_name(const session_config& c) {
  if (c.policy == "vdnn") return c.vdnn_variant == "conv" ? "vdnn-conv" : "vdnn-all";
  return c.policy;
}

/// Copy bandwidth of the device's link, measured once with pinned memory (32 MiB each way).
std::pair<double, double> measure_link(Device& dev) {
  constexpr std::size_t n = std::size_t{32} << 20;
  void* host = dev.allocate_pinned(n);
  void* d = nullptr;
  try {
    d = dev.allocate(n);
  } catch (const out_of_memory&) {
    dev.deallocate_pinned(host, n);
    return {8e9, 8e9};
  }
  std::memset(host, 0, n);
  owned_stream s(dev);
  auto time = [&](void* dst, const void* src, copy_kind k) {
    dev.copy_async(dst, src, n, k, s);
    dev.synchronize_stream(s);
    const auto t0 = std::chrono::steady_clock::now();
    dev.copy_async(dst, src, n, k, s);
    dev.synchronize_stream(s);
    return static_cast<double>(n) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double h2d = time(d, host, copy_kind::host_to_device);
  const double d2h = time(host, d, copy_kind::device_to_host);
  dev.deallocate(d, n);
  dev.deallocate_pinned(host, n);
  return {h2d, d2h};
}
}  // namespace session_detail


// ---- Session -----------------------------------------------------------------------------------

Session::Session(session_config config) : Session(std::move(config), session_hooks{}) {}
Session::Session(session_config config, const session_hooks& hooks)
    : impl_(std::make_unique<session_impl>(std::move(config), hooks)) {}
Session::~Session() = default;

Device& Session::device() { return *impl_->dev; }
const session_config& Session::config() const noexcept { return impl_->cfg; }
std::uint64_t Session::device_budget() const noexcept { return impl_->stack->budget().bytes(); }

// A refused budget changes nothing: it is checked before the arena is reserved again, and a
// phase's plan refused for it puts every phase's plan and the old budget back.
void session_impl::set_device_budget(std::uint64_t bytes) {
  end_failed_step();
  SPILLWAY_EXPECTS_T(usage_error, !in_iteration,
                     "set_device_budget(" + format_bytes(bytes) + ") inside an iteration; call it after end_iteration()");
  const device_budget budget(bytes);
  budget.check_fits(*dev);
  const std::uint64_t least = least_of_all();
  if (bytes < least) {
    throw config_error("set_device_budget: " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                       " B) is below the least the recorded iteration needs: " + format_bytes(least) + " (" +
                       std::to_string(least) + " B, its largest single op's working set); give at least that");
  }
  const device_budget old = stack->budget();
  stack->set_device_budget(budget);  // every tensor leaves for its tier; the arena is reserved again
  // Every phase's plan, made again for the new budget. One refused (the plan would need more
  // of the host or NVMe tier than there is) refuses the budget: every phase keeps its plan,
  // the Session its old budget.
  std::vector<std::pair<phase_state*, phase_state>> before;
  try {
    for (auto& [tag, ph] : phases) {
      if (!ph.have_plan) continue;
      before.emplace_back(&ph, ph);
      ph.margin_doublings = device_budget::no_margin;
      plan_trace(ph, ph.recorded);
    }
  } catch (...) {
    for (auto& [ph, was] : before) *ph = std::move(was);
    stack->set_device_budget(old);
    if (active != nullptr && active->have_plan) exec->follow(&active->recorded, &active->p, &active->layout);
    throw;
  }
  ratio_refused = nullptr;  // the loop chose the budget itself
  shapes.clear();           // made for the old budget (Note [Shapes])
  churn.clear();
}

void Session::set_device_budget(std::uint64_t bytes) {
  const session_detail::session_call claim(*impl_, "set_device_budget");
  impl_->set_device_budget(bytes);
}

tensor_handle Session::add_persistent(std::string name, std::uint64_t bytes, tensor_kind kind, const void* initial) {
  const session_detail::session_call claim(*impl_, "add_persistent", name);
  if (!is_persistent(kind))
    throw config_error("add_persistent(\"" + name + "\"): kind " + std::string(to_string(kind)) +
                       " is transient; give a parameter, gradient or optimizer state kind, or use add_transient");
  const auto id = impl_->add_tensor(std::move(name), bytes, kind);
  try {
    if (impl_->awaiting_add.contains(impl_->tensors[id].name))
      impl_->take_awaited_value(id);  // Note [State added after load] in session_checkpoint.cpp
    else
      impl_->exec->upload(id, initial);
  } catch (...) {
    impl_->forget_tensor(id);  // not registered: the loop may add it again, and save() skips nothing
    throw;
  }
  return tensor_handle{id};
}

tensor_handle Session::add_transient(std::string name, std::uint64_t bytes, tensor_kind kind) {
  const session_detail::session_call claim(*impl_, "add_transient", name);
  if (is_persistent(kind))
    throw config_error("add_transient(\"" + name + "\"): kind " + std::string(to_string(kind)) +
                       " is persistent; give an activation, workspace or metric kind, or use add_persistent");
  SPILLWAY_EXPECTS_T(usage_error, impl_->in_iteration, "add_transient(\"" + name + "\") outside an iteration");
  return tensor_handle{impl_->add_tensor(std::move(name), bytes, kind)};
}

tensor_handle Session::add_view(tensor_handle parent, std::uint64_t offset, std::uint64_t bytes, std::string name) {
  const session_detail::session_call claim(*impl_, "add_view");
  return impl_->add_view(parent, offset, bytes, std::move(name));
}

void Session::release(tensor_handle t) {
  const session_detail::session_call claim(*impl_, "release");  // outside the try: a refused call fails no step
  try {
    impl_->check_handle(t);
    impl_->exec->release(t.id);
    impl_->live.erase(t.id);
  } catch (...) {
    impl_->note_failure();
    throw;
  }
}

void Session::read(tensor_handle t, void* host, std::uint64_t bytes) {
  const session_detail::session_call claim(*impl_, "read");
  impl_->check_handle(t);
  const auto& d = impl_->tensors[t.id];
  SPILLWAY_EXPECTS_T(usage_error, bytes == d.bytes,
                     "read(\"" + d.name + "\"): asked for " + std::to_string(bytes) + " bytes; it has " +
                         std::to_string(d.bytes));
  SPILLWAY_EXPECTS_T(usage_error, !impl_->op_open, "read(\"" + d.name + "\") inside an op's scope");
  SPILLWAY_EXPECTS_T(usage_error, host != nullptr, "read(\"" + d.name + "\"): host is null; give memory of " +
                                                       std::to_string(d.bytes) + " bytes to copy into");
  impl_->read(t, host);
}

void Session::write(tensor_handle t, const void* host, std::uint64_t bytes) {
  const session_detail::session_call claim(*impl_, "write");
  auto& s = *impl_;
  s.end_failed_step();  // as save and load do: a loop may write right after a failed step
  s.check_handle(t);
  const auto& d = s.tensors[t.id];
  SPILLWAY_EXPECTS_T(usage_error, !s.in_iteration,
                     "write(\"" + d.name + "\") inside an iteration; call it after end_iteration(), or write the "
                     "tensor in an op (an op that writes it, with a copy on op.stream())");
  SPILLWAY_EXPECTS_T(usage_error, is_persistent(d.kind),
                     "write(\"" + d.name + "\"): a transient, which holds no value between iterations; write it in "
                     "an op inside the iteration");
  SPILLWAY_EXPECTS_T(usage_error, bytes == d.bytes,
                     "write(\"" + d.name + "\"): given " + std::to_string(bytes) + " bytes; it has " +
                         std::to_string(d.bytes));
  SPILLWAY_EXPECTS_T(usage_error, host != nullptr, "write(\"" + d.name + "\"): host is null; give its bytes");
  s.finalize_views();  // views added since the last iteration take their ranges first
  for (const auto id : s.pieces_of(t.id)) {  // an overwrite ends any sum (Note [Sums no op read])
    s.unread_sums.erase(id);
    s.lost_sums.erase(id);
  }
  if (!s.is_split(t.id)) {
    s.exec->upload(t.id, host);
    return;
  }
  for (const auto& pc : s.splits.at(t.id).pieces) s.exec->upload(pc.id, static_cast<const std::byte*>(host) + pc.offset);
}

void Session::begin_iteration(std::string_view tag) {
  const session_detail::session_call claim(*impl_, "begin_iteration");
  impl_->begin_iteration(tag);
}
iteration_report Session::end_iteration() {
  const session_detail::session_call claim(*impl_, "end_iteration");
  return impl_->end_iteration();
}
bool Session::abandon_iteration() noexcept {
  // From a thread other than the one inside a call or holding an op open, it does nothing: the
  // step is that thread's to end (Note [One thread at a time]).
  const session_detail::session_call claim(*impl_, "abandon_iteration", {}, session_detail::session_call::mode::try_only);
  if (!claim.entered()) return false;
  if (impl_->in_iteration) impl_->end_failed_iteration();
  return true;
}

Session::op_scope Session::op(std::string_view name, std::initializer_list<tensor_handle> reads,
                              std::initializer_list<tensor_handle> writes, double flops) {
  return op(name, std::span<const tensor_handle>(reads.begin(), reads.size()),
            std::span<const tensor_handle>(writes.begin(), writes.size()), flops);
}

Session::op_scope Session::op(std::string_view name, std::span<const tensor_handle> reads,
                              std::span<const tensor_handle> writes, double flops) {
  return op(name, reads, writes, {}, flops);
}

Session::op_scope Session::op(std::string_view name, std::initializer_list<tensor_handle> reads,
                              std::initializer_list<tensor_handle> writes,
                              std::initializer_list<tensor_handle> accumulates, double flops) {
  return op(name, std::span<const tensor_handle>(reads.begin(), reads.size()),
            std::span<const tensor_handle>(writes.begin(), writes.size()),
            std::span<const tensor_handle>(accumulates.begin(), accumulates.size()), flops);
}

Session::op_scope Session::op(std::string_view name, std::span<const tensor_handle> reads,
                              std::span<const tensor_handle> writes, std::span<const tensor_handle> accumulates,
                              double flops) {
  const session_detail::session_call claim(*impl_, "op", name);
  op_scope scope(impl_.get(),
                 impl_->open_op(name, reads, writes, accumulates, flops, session_detail::phase_from_name(name)));
  scope.serial_ = impl_->ops_opened;
  return scope;
}

Session::op_scope::~op_scope() noexcept(false) {
  if (s_ == nullptr || rerun_) return;
  const session_detail::session_call claim(*s_, "the end of an op's scope", {}, session_detail::session_call::mode::wait);
  if (stale()) return;  // its iteration was given up: the op open now is another's (Note [Stale scopes])
  if (std::uncaught_exceptions() > 0) {
    // An exception leaves the op's scope: the step has failed (Note [Failed iterations]).
    if (s_->in_iteration) s_->iteration_failed = true;
    try {
      s_->end_op(index_);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the exception already unwinding wins
    }
    return;
  }
  s_->end_op(index_);
}

Session::op_scope::op_scope(op_scope&& other) noexcept
    : s_(other.s_), index_(other.index_), rerun_(other.rerun_), serial_(other.serial_) {
  other.s_ = nullptr;
}

// Note [Stale scopes]
// A scope left alive when its iteration was given up (abandon_iteration) outlives its op, and
// the next iteration's op k has the same index k. Ended then, it ended the op open at that time;
// its ptr() named that op's tensors. So each scope Session::op makes holds the count of ops
// opened when it was made, and one whose count is no longer the latest with its op closed or
// another open is stale: its end does nothing, and its other calls are refused.
bool Session::op_scope::stale() const { return serial_ != 0 && (serial_ != s_->ops_opened || !s_->op_open); }

stream Session::op_scope::stream() const noexcept { return s_->exec->compute_stream(); }
stream Session::stream() const noexcept { return impl_->exec->compute_stream(); }
Device& Session::op_scope::device() const noexcept { return *s_->dev; }

// Note [Op seeds]
// op_scope::seed() mixes the number of the iteration with the op's index in it, through
// splitmix64's finalizer, so nearby pairs give unrelated seeds. A rerun's scope carries the index
// of the op it runs again, so it gets the first run's seed. The iteration's number is how many
// iterations the Session has ended: one that failed (Note [Failed iterations]) or was abandoned
// does not count, so a loop that runs a failed step again draws what the failed attempt drew,
// as a loop that never failed draws; save() keeps the number in the checkpoint and load() takes
// it back (Note [Checkpoint format] in checkpoint.hpp), so a run resumed in a new Session draws
// what the run that saved would have drawn next. A checkpoint of format 1, which does not keep
// it, leaves the Session's own count.
std::uint64_t Session::op_scope::seed() const {
  SPILLWAY_EXPECTS_T(usage_error, s_ != nullptr, "seed() of an op scope that was moved from");
  std::uint64_t z = (s_->iterations_ended << 32) + index_ + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void* Session::op_scope::raw_ptr(tensor_handle t) const {
  SPILLWAY_EXPECTS_T(usage_error, s_ != nullptr, "ptr() of an op scope that was moved from");
  SPILLWAY_EXPECTS_T(usage_error, !stale(), "ptr() of an op scope whose op is no longer open (its iteration was given up)");
  return s_->op_ptr(t);
}

void* Session::op_scope::workspace(std::uint64_t bytes) const {
  SPILLWAY_EXPECTS_T(usage_error, s_ != nullptr, "workspace() of an op scope that was moved from");
  const session_detail::session_call claim(*s_, "an op scope's workspace()");
  SPILLWAY_EXPECTS_T(usage_error, !stale(), "workspace() of an op scope whose op is no longer open (its iteration was given up)");
  try {
    return s_->exec->scratch(bytes);
  } catch (...) {
    s_->note_failure();
    throw;
  }
}

const std::vector<iteration_report>& Session::history() const noexcept { return impl_->history; }
const trace& Session::recorded_trace() const noexcept {
  static const trace none;
  return impl_->active != nullptr ? impl_->active->recorded : none;
}
const plan* Session::current_plan() const noexcept {
  return impl_->active != nullptr && impl_->active->have_plan ? &impl_->active->p : nullptr;
}
std::uint64_t Session::footprint_bytes() const { return impl_->active != nullptr ? impl_->active->footprint : 0; }
std::uint64_t Session::least_budget_bytes() const { return impl_->least_of_all(); }
void Session::write_chrome_trace(const std::string& path) const {
  const session_detail::session_call claim(*impl_, "write_chrome_trace");
  impl_->write_chrome_trace(path);
}

}  // namespace spillway
