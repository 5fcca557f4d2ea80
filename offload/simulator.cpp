// Simulator: an in-order replay of one iteration (Note [Simulator model]). The reference times
// every result carries are in simulator_bounds.cpp (Note [Lower bound]).
#include "offload/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <queue>

#include "allocator/device_budget.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/layout.hpp"
#include "prefetch/recompute.hpp"

namespace spillway::offload {

std::string_view to_string(sim_track t) noexcept {
  constexpr std::string_view names[] = {"compute", "h2d", "d2h", "nvme_read", "nvme_write", "recompute", "host", "network"};
  return names[static_cast<int>(t)];
}

namespace {

struct tensor_state {
  bool on_device = false;
  bool device_valid = false;
  bool host_valid = false;
  bool nvme_valid = false;
  bool host_held = false;  // host tier bytes reserved for it
  bool nvme_held = false;
  double ready = 0;        // device copy usable from
  double host_ready = 0;   // host copy complete at
  double nvme_ready = 0;
  bool stale = false;          // a host op wrote the value since this device copy was made
  double host_read_until = 0;  // the last copy up from the host copy ends at
  double net_read_until = 0;   // the last collective that reads the device copy ends at
  std::int64_t offset = -1;    // its address in sim_options::layout, while on the device there
};

// Note [Addresses in the replay]
// With sim_options::layout, every allocation the layout places takes its address there, and
// bytes are handed on only once the tensor that held them is gone: a copy in, or the op that
// writes a tensor, waits until the last of the earlier tensors at those addresses has been
// freed (a copy out freed when it ends). A layout kept apart in device time (plan_timing)
// meets no such wait in the replay it was timed by; one packed in the executor's order alone
// can: a prefetch may be placed where a copy out is still running, and waits for it, as the
// arena makes it wait (Note [Arena handoff] in allocator/arena_allocator.hpp). An allocation
// the layout has no place for is only counted. Per address range, the time it is free from.
class address_clock {
 public:
  /// When every byte of [from, to) is free.
  [[nodiscard]] double free_from(std::size_t from, std::size_t to) const {
    double t = 0;
    auto it = spans_.upper_bound(from);
    if (it != spans_.begin()) --it;
    for (; it != spans_.end() && it->first < to; ++it)
      if (it->second.first > from) t = std::max(t, it->second.second);
    return t;
  }
  /// [from, to) is free from `at` (or later, where it was already).
  void freed(std::size_t from, std::size_t to, double at) {
    double t = at;
    auto it = spans_.upper_bound(from);
    if (it != spans_.begin()) --it;
    while (it != spans_.end() && it->first < to) {
      const auto [start, span] = *it;
      const auto [end, when] = span;
      if (end <= from) {
        ++it;
        continue;
      }
      it = spans_.erase(it);
      if (start < from) spans_.emplace(start, std::make_pair(from, when));
      if (end > to) spans_.emplace(to, std::make_pair(end, when));
      t = std::max(t, when);
    }
    spans_.emplace(from, std::make_pair(to, t));
  }

 private:
  std::map<std::size_t, std::pair<std::size_t, double>> spans_;  // from -> (to, free from)
};

/// A tier's bytes held now against its capacity, and whether it has passed it (said once).
struct tier_gauge {
  const char* label;
  std::uint64_t capacity;
  std::uint64_t in_use = 0;
  bool over = false;
};

class replay {
 public:
  replay(const trace& t, const lifetime_report& lt, const plan& p, const hw_profile& hw, const sim_options& opt)
      : t_(t), p_(p), hw_(hw), opt_(opt), lt_(lt), st_(t.tensors.size()) {
    // Only a plan that reruns ops needs the index (most plans a search judges do not).
    if (std::any_of(p.steps.begin(), p.steps.end(), [](const plan_step& s) { return !s.recomputes.empty(); })) {
      reruns_ = rerun_index(t, p);
      has_reruns_ = true;
      freed_at_.assign(t.tensors.size(), -1);
      in_temps_.assign(t.tensors.size(), 0);
    }
  }

  sim_result run() {
    p_.validate(t_);
    if (opt_.comm) opt_.comm->validate(t_);
    start_state();
    const std::size_t n = t_.ops.size();
    double boundary = 0;
    for (op_index k = 0; k < n; ++k) {
      if (k > 0) issue_evictions(k - 1, boundary);
      for (const auto& pf : p_.steps[k].prefetches) issue_prefetch(pf, k, boundary);
      const bool sync = p_.steps[k].synchronous;
      const double all_done =
          sync ? std::max({boundary, h2d_free(), d2h_free(), nvme_r_free_, nvme_w_free_, host_end(), net_free_}) : 0.0;
      if (p_.steps[k].on_host) {
        // The executor runs a host op on the thread that issues the iteration and enqueues the
        // device work after it once it has finished (Note [Host ops in the executor]).
        boundary = std::max(boundary, run_host_op(k, all_done));
        continue;
      }
      boundary = std::max(boundary, all_done);
      if (const collective* c = opt_.comm ? opt_.comm->find(k) : nullptr) {
        run_collective(k, *c, boundary);
        continue;
      }
      for (op_index o : p_.steps[k].recomputes) boundary = run_op(o, boundary, k);
      if (!p_.steps[k].recomputes.empty()) free_temps_before_op(k, boundary);
      boundary = run_op(k, boundary, k);
    }
    if (n > 0) issue_evictions(static_cast<op_index>(n - 1), boundary);
    double end = boundary;
    end = std::max({end, h2d_free(), d2h_free(), nvme_r_free_, nvme_w_free_});
    end = std::max({end, host_end(), net_free_});
    while (!frees_.empty()) {
      end = std::max(end, frees_.top().first);
      release_until(frees_.top().first);
    }
    end_state();
    r_.step_seconds = end;
    r_.stall_seconds = std::max(0.0, end - r_.compute_seconds - r_.recompute_seconds);
    return std::move(r_);
  }

 private:
  using free_entry = std::pair<double, std::uint64_t>;

  void violation(std::string msg) {
    if (r_.violations.size() < opt_.max_violations) r_.violations.push_back(std::move(msg));
    ++r_.violation_count;
  }
  const std::string& name(tensor_id x) const { return t_.tensors[x].name; }
  std::uint64_t bytes(tensor_id x) const { return t_.tensors[x].bytes; }
  std::string op_label(op_index k) const { return "op " + std::to_string(k) + " ('" + t_.ops[k].name + "')"; }

  // Why device memory is taken; spelled out only for a violation message.
  struct reason {
    enum kind_t : std::uint8_t { prefetch, writes, reads } kind;
    op_index op;
    tensor_id x;
    op_index before = 0;  // for a recomputation of `op`: the op it runs before
    bool rerun = false;
  };
  std::string describe(const reason& w) const {
    const std::string who = w.rerun ? "recomputation of " + op_label(w.op) + " before " + op_label(w.before) : op_label(w.op);
    switch (w.kind) {
      case reason::prefetch: return "prefetch of '" + name(w.x) + "' before " + op_label(w.op);
      case reason::writes: return who + " writing '" + name(w.x) + "'";
      default: return who + " reads '" + name(w.x) + "'";
    }
  }

  // Whether some op in (from, to) writes x: then a rerun of `from` before `to` would see (for a
  // read) or restore (for a write) another value than op `from` did.
  bool written_between(tensor_id x, op_index from, op_index to) const {
    const auto& uses = lt_.tensors[x].uses;
    auto it = std::upper_bound(uses.begin(), uses.end(), from, [](op_index v, const tensor_use& u) { return v < u.op; });
    for (; it != uses.end() && it->op < to; ++it)
      if (it->writes) return true;
    return false;
  }
  // Whether the op that last wrote x up to op k (inclusive) is recomputable: then the value
  // can be made again (Note [Recomputation]), so dropping it loses nothing.
  bool regenerable(tensor_id x, op_index k) const {
    const auto& uses = lt_.tensors[x].uses;
    auto it = std::upper_bound(uses.begin(), uses.end(), k, [](op_index v, const tensor_use& u) { return v < u.op; });
    while (it != uses.begin()) {
      --it;
      if (it->writes) return t_.ops[it->op].recomputable;
    }
    return false;
  }

  // True when some later op (or, for tensors crossing the boundary, the next iteration) reads
  // the value the tensor holds after op `k`.
  // A rerun of a later step that reads it before the program writes it again needs it too.
  bool value_needed_after(tensor_id x, op_index k) const {
    const auto& uses = lt_.tensors[x].uses;
    auto it = std::upper_bound(uses.begin(), uses.end(), k, [](op_index v, const tensor_use& u) { return v < u.op; });
    const op_index rerun_read = reruns_.next_rerun_read(x, k);  // none without reruns
    if (it != uses.end()) return it->reads || rerun_read <= it->op;
    return lt_.tensors[x].crosses_boundary || rerun_read != std::numeric_limits<op_index>::max();
  }

  double& h2d_queue() { return hw_.copy_engines >= 2 ? h2d_free_ : d2h_free_; }
  double h2d_free() const { return hw_.copy_engines >= 2 ? h2d_free_ : d2h_free_; }
  double d2h_free() const { return d2h_free_; }

  void sample(double time) {
    if (opt_.record_timeline) r_.memory.push_back({time * 1e6, device_cur_});
  }
  void event(sim_track tr, std::uint32_t id, double s, double e, std::uint64_t b) {
    if (opt_.record_timeline) r_.timeline.push_back({tr, id, s, e, b});
  }

  void release_until(double time) {
    bool any = false;
    while (!frees_.empty() && frees_.top().first <= time) {
      device_cur_ -= frees_.top().second;
      frees_.pop();
      any = true;
    }
    if (any) sample(time);
  }

  // Takes `b` device bytes no earlier than `at`, in program order; returns when they are taken.
  double allocate(std::uint64_t b, double at, const reason& why) {
    mem_clock_ = std::max(mem_clock_, at);
    release_until(mem_clock_);
    while (device_cur_ + b > p_.budget_bytes && !frees_.empty()) {
      mem_clock_ = std::max(mem_clock_, frees_.top().first);
      release_until(mem_clock_);
    }
    if (device_cur_ + b > p_.budget_bytes)
      violation(describe(why) + " needs " + format_bytes(b) + " with " + format_bytes(device_cur_) + " in use: over the budget of " +
                format_bytes(p_.budget_bytes));
    device_cur_ += b;
    r_.peak_device_bytes = std::max(r_.peak_device_bytes, device_cur_);
    sample(mem_clock_);
    return mem_clock_;
  }

  // Where the layout places x's allocation at `slot`: remembered for its free; returns when
  // those bytes are free (Note [Addresses in the replay]). 0 without a layout or a place there.
  double address_free(tensor_id x, std::uint32_t slot) {
    auto& s = st_[x];
    s.offset = -1;
    if (opt_.layout == nullptr) return 0;
    const auto at = opt_.layout->offset(x, slot);
    if (!at) return 0;
    s.offset = static_cast<std::int64_t>(*at);
    return addresses_.free_from(*at, *at + device_budget::placed(bytes(x)));
  }
  // x's bytes go back at `time`: a device free that also frees its address.
  void free_device(tensor_id x, double time) {
    frees_.push({time, bytes(x)});
    auto& s = st_[x];
    if (s.offset < 0) return;
    const auto at = static_cast<std::size_t>(s.offset);
    addresses_.freed(at, at + device_budget::placed(bytes(x)), time);
    s.offset = -1;
  }

  // Reserves x's bytes on a tier once; the first time the tier passes its capacity is a violation.
  void hold(tensor_id x, bool tensor_state::*held, tier_gauge& tier, std::uint64_t& peak) {
    if (st_[x].*held) return;
    st_[x].*held = true;
    tier.in_use += bytes(x);
    peak = std::max(peak, tier.in_use);
    if (tier.in_use > tier.capacity && !tier.over) {
      tier.over = true;
      violation(std::string(tier.label) + " over its capacity of " + format_bytes(tier.capacity) + " when '" + name(x) +
                "' arrives");
    }
  }
  void hold_host(tensor_id x) { hold(x, &tensor_state::host_held, host_, r_.peak_host_bytes); }
  void hold_nvme(tensor_id x) { hold(x, &tensor_state::nvme_held, nvme_, r_.peak_nvme_bytes); }
  void release_tiers(tensor_id x) {
    auto& s = st_[x];
    if (s.host_held) host_.in_use -= bytes(x);
    if (s.nvme_held) nvme_.in_use -= bytes(x);
    s.host_held = s.nvme_held = s.host_valid = s.nvme_valid = false;
  }

  void start_state() {
    for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
      const auto& d = t_.tensors[x];
      if (!is_persistent(d.kind)) continue;
      const tier home = p_.initial_tier[x];
      auto& s = st_[x];
      if (home == tier::device) {
        (void)address_free(x, layout_slot::start_fetch);
        s.on_device = true;
        s.device_valid = true;
        device_cur_ += d.bytes;
      } else if (lt_.tensors[x].crosses_boundary) {
        if (home == tier::host) {
          s.host_valid = true;
          hold_host(x);
        } else {
          s.nvme_valid = true;
          hold_nvme(x);
        }
      }
    }
    r_.peak_device_bytes = device_cur_;
    sample(0);
    if (device_cur_ > p_.budget_bytes)
      violation("tensors that start on the device hold " + format_bytes(device_cur_) + ", over the budget of " +
                format_bytes(p_.budget_bytes));
  }

  // Note [Rerun temps before the op] (prefetch/recompute.hpp): the values reruns made that op k
  // does not touch and nothing reads later go once the reruns have run, before op k allocates.
  void free_temps_before_op(op_index k, double at) {
    std::vector<tensor_id> kept;
    for (tensor_id x : temps_) {
      auto& s = st_[x];
      in_temps_[x] = 0;
      if (!s.on_device) continue;
      if (!reruns_.freed_before_op(x, k)) {
        in_temps_[x] = 1;
        kept.push_back(x);
        continue;
      }
      free_device(x, std::max(at, s.net_read_until));
      release_tiers(x);
      s.on_device = false;
      s.device_valid = false;
      s.stale = false;
      freed_at_[x] = static_cast<std::int64_t>(k);
    }
    temps_ = std::move(kept);
  }

  void issue_evictions(op_index k, double at) {
    for (const auto& e : p_.steps[k].evictions) {
      auto& s = st_[e.tensor];
      if (!s.on_device && has_reruns_ && freed_at_[e.tensor] == static_cast<std::int64_t>(k)) continue;  // a temp gone before op k
      const auto b = bytes(e.tensor);
      if (!s.on_device) {
        violation("after " + op_label(k) + ": evicts '" + name(e.tensor) + "', which is not on the device");
        continue;
      }
      const bool needed = value_needed_after(e.tensor, k);
      evict_action action = e.action;
      if (s.stale) {  // the host tier holds the newer value (Note [Host ops])
        if (action == evict_action::evict_to_nvme)
          violation("after " + op_label(k) + ": copies '" + name(e.tensor) + "' to NVMe from a stale device copy");
        action = evict_action::drop;
      }
      if ((action == evict_action::evict_to_host && s.host_valid) ||
          (action == evict_action::evict_to_nvme && s.nvme_valid))
        action = evict_action::drop;  // the tier already holds this value
      if (action == evict_action::drop) {
        if (needed && s.device_valid && !s.host_valid && !s.nvme_valid && !regenerable(e.tensor, k))
          violation("after " + op_label(k) + ": drops '" + name(e.tensor) + "', whose value is needed later and has no copy");
        if (!needed) release_tiers(e.tensor);
        free_device(e.tensor, std::max(at, s.net_read_until));  // a collective may still read it
      } else {
        const double start = std::max({at, d2h_free_, s.ready});
        const double end = start + static_cast<double>(b) / hw_.d2h_bytes_per_s;
        d2h_free_ = end;
        r_.d2h_bytes += b;
        event(sim_track::d2h, e.tensor, start, end, b);
        free_device(e.tensor, std::max(end, s.net_read_until));  // after the copy, and any collective reading it
        if (action == evict_action::evict_to_host) {
          s.host_valid = true;
          s.host_ready = end;
          hold_host(e.tensor);
        } else {
          const double ws = std::max(end, nvme_w_free_);
          const double we = ws + static_cast<double>(b) / hw_.nvme_write_bytes_per_s;
          nvme_w_free_ = we;
          r_.nvme_write_bytes += b;
          event(sim_track::nvme_write, e.tensor, ws, we, b);
          s.nvme_valid = true;
          s.nvme_ready = we;
          hold_nvme(e.tensor);
        }
      }
      s.on_device = false;
      s.device_valid = false;
      s.stale = false;
    }
  }

  // Copies the tensor's value from `from` into freshly taken device memory; returns its ready time.
  double fetch(tensor_id x, tier from, double at, const reason& why, std::uint32_t slot) {
    auto& s = st_[x];
    const auto b = bytes(x);
    const double alloc_at = std::max(allocate(b, at, why), address_free(x, slot));
    double src_ready = s.host_ready;
    if (from == tier::nvme) {
      const double rs = std::max({at, nvme_r_free_, s.nvme_ready});
      const double re = rs + static_cast<double>(b) / hw_.nvme_read_bytes_per_s;
      nvme_r_free_ = re;
      r_.nvme_read_bytes += b;
      event(sim_track::nvme_read, x, rs, re, b);
      src_ready = re;
    }
    double& q = h2d_queue();
    const double start = std::max({alloc_at, q, src_ready});
    const double end = start + static_cast<double>(b) / hw_.h2d_bytes_per_s;
    q = end;
    if (from == tier::host) s.host_read_until = std::max(s.host_read_until, end);
    r_.h2d_bytes += b;
    event(sim_track::h2d, x, start, end, b);
    s.on_device = true;
    s.device_valid = true;
    s.ready = end;
    return end;
  }

  void issue_prefetch(const prefetch& pf, op_index k, double at) {
    auto& s = st_[pf.tensor];
    const reason why{reason::prefetch, k, pf.tensor};
    if (s.on_device) {
      violation(describe(why) + ": already on the device");
      return;
    }
    const bool has = pf.from == tier::host ? s.host_valid : s.nvme_valid;
    if (!has) {
      violation(describe(why) + ": no valid copy in tier " + std::string(tier_name(pf.from)));
      return;
    }
    fetch(pf.tensor, pf.from, at, why, layout_slot::prefetch(k));
  }

  // Makes tensor x ready on the device for op k (run before op `at`: a recomputation when
  // k != at), which reads it or only writes it; returns the op's start pushed past it.
  double need(tensor_id x, bool reads, op_index k, op_index at, double boundary, double start) {
    const bool rerun = k != at;
    auto& s = st_[x];
    const reason why{reads ? reason::reads : reason::writes, k, x, at, rerun};
    if (rerun && written_between(x, k, at))
      violation(describe(why) + ", whose value has changed since the op ran: the rerun would not give the same bits");
    if (s.on_device) {
      if (reads && s.stale)
        violation(describe(why) + " from a stale device copy: a host op wrote it since (Note [Host ops])");
      return std::max(start, s.ready);
    }
    const std::uint32_t slot = rerun ? layout_slot::rerun(at) : layout_slot::place(k);
    if (!reads) {
      start = std::max({start, allocate(bytes(x), boundary, why), address_free(x, slot)});
      s.on_device = true;
      s.ready = 0;
      return start;
    }
    if (!s.host_valid && !s.nvme_valid) {
      violation(describe(why) + ", whose value was lost");
      start = std::max(start, allocate(bytes(x), boundary, why));
      s.on_device = true;
      return start;
    }
    violation(describe(why) + ", which is not resident and was not prefetched (fetched on demand)");
    ++r_.on_demand_fetches;
    return std::max(start, fetch(x, s.host_valid ? tier::host : tier::nvme, boundary, why, slot));
  }
  // Readies op k's tensors from `boundary` on; returns when it may start.
  double need_all(op_index k, op_index at, double boundary) {
    const auto& op = t_.ops[k];
    double start = boundary;
    for (tensor_id x : op.reads) start = need(x, true, k, at, boundary, start);
    for (tensor_id x : op.writes)
      if (std::find(op.reads.begin(), op.reads.end(), x) == op.reads.end()) start = need(x, false, k, at, boundary, start);
    for (tensor_id x : op.writes) start = std::max(start, st_[x].net_read_until);  // a collective still reads it
    return start;
  }

  // Runs op k on the compute queue from `boundary`; when k != at, as a recomputation of op k
  // before op `at` (Note [Recomputation]).
  double run_op(op_index k, double boundary, op_index at) {
    const auto& op = t_.ops[k];
    const bool rerun = k != at;
    const double start = need_all(k, at, boundary);
    const double dur = hw_.op_seconds(op);
    const double end = start + dur;
    if (rerun) {
      r_.recompute_seconds += dur;
      ++r_.recomputes;
      for (tensor_id x : op.writes)
        if (!in_temps_[x]) {
          in_temps_[x] = 1;
          temps_.push_back(x);
        }
    } else {
      r_.compute_seconds += dur;
    }
    event(rerun ? sim_track::recompute : sim_track::compute, k, start, end, 0);
    for (tensor_id x : op.writes) {
      auto& s = st_[x];
      s.device_valid = true;
      s.stale = false;
      s.ready = end;
      if (!rerun) release_tiers(x);  // copies elsewhere are stale now; a rerun writes the same bits
    }
    return end;
  }

  // Runs collective op k on the network queue (Note [Network stream]): the compute stream goes
  // on; the traffic also takes its share of the PCIe link each way.
  void run_collective(op_index k, const collective& c, double boundary) {
    const auto& op = t_.ops[k];
    const double start = std::max(need_all(k, k, boundary), net_free_);
    const auto cost = ring_cost_of(c.kind, c.bytes, opt_.comm->ranks);
    double end = start + cost.steps * hw_.network_latency_s;
    if (cost.wire_bytes > 0 && std::isfinite(hw_.network_bytes_per_s)) {
      const double w = static_cast<double>(cost.wire_bytes);
      end += w / hw_.network_bytes_per_s;
      if (hw_.copy_engines >= 2) {
        h2d_free_ = std::max(start, h2d_free_) + w / hw_.h2d_bytes_per_s;
        d2h_free_ = std::max(start, d2h_free_) + w / hw_.d2h_bytes_per_s;
        end = std::max({end, h2d_free_, d2h_free_});
      } else {  // one queue for the link; the sends and the receives cross it at once
        d2h_free_ = std::max(start, d2h_free_) + w / std::min(hw_.h2d_bytes_per_s, hw_.d2h_bytes_per_s);
        end = std::max(end, d2h_free_);
      }
    }
    net_free_ = end;
    ++r_.collectives;
    r_.network_seconds += end - start;
    r_.network_bytes += cost.wire_bytes;
    event(sim_track::network, k, start, end, cost.wire_bytes);
    for (tensor_id x : op.reads) st_[x].net_read_until = std::max(st_[x].net_read_until, end);
    for (tensor_id x : op.writes) {
      auto& s = st_[x];
      s.device_valid = true;
      s.stale = false;
      s.ready = end;
      release_tiers(x);
    }
  }

  // Runs op k on the host queue (Note [Host ops]): no device memory, no compute stream.
  double host_end() const { return host_free_; }

  // Returns when it ends.
  double run_host_op(op_index k, double not_before) {
    const auto& op = t_.ops[k];
    double ready = not_before;
    for (tensor_id x : op.reads) {
      const auto& s = st_[x];
      if (!s.host_valid)
        violation(op_label(k) + " on the host reads '" + name(x) + "', which has no valid copy in the host tier");
      ready = std::max(ready, s.host_ready);
    }
    for (tensor_id x : op.writes) ready = std::max({ready, st_[x].host_ready, st_[x].host_read_until});
    const double dur = hw_.host_op_seconds(op);
    // In program order: after the host op before it, as the executor runs them.
    const double start = std::max(ready, host_free_);
    const double end = start + dur;
    host_free_ = end;
    r_.host_seconds += dur;
    ++r_.host_ops;
    event(sim_track::host, k, start, end, op.host_bytes);
    for (tensor_id x : op.writes) {
      auto& s = st_[x];
      if (s.nvme_held) nvme_.in_use -= bytes(x);
      s.nvme_held = s.nvme_valid = false;
      hold_host(x);
      s.host_valid = true;
      s.host_ready = end;
      if (s.on_device) {
        s.stale = true;
        s.device_valid = false;
      }
    }
    return end;
  }

  void end_state() {
    for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
      const auto& s = st_[x];
      if (!is_persistent(t_.tensors[x].kind)) {
        if (s.on_device) violation("transient '" + name(x) + "' is still on the device at the end (no drop)");
        continue;
      }
      const tier home = p_.initial_tier[x];
      if (s.stale && lt_.tensors[x].crosses_boundary)
        violation("'" + name(x) + "' ends the iteration with a stale device copy (a host op wrote it; Note [Host ops])");
      if (home == tier::device) {
        if (!s.on_device) violation("'" + name(x) + "' starts on the device but ends elsewhere");
      } else {
        if (s.on_device) violation("'" + name(x) + "' starts in " + std::string(tier_name(home)) + " but ends on the device");
        if (lt_.tensors[x].crosses_boundary && !(home == tier::host ? s.host_valid : s.nvme_valid))
          violation("'" + name(x) + "' ends without a valid copy in its starting tier " + std::string(tier_name(home)));
      }
    }
  }

  const trace& t_;
  const plan& p_;
  const hw_profile& hw_;
  const sim_options& opt_;
  const lifetime_report& lt_;
  std::vector<tensor_state> st_;
  rerun_index reruns_;       // empty (answers none) unless the plan reruns ops
  bool has_reruns_ = false;
  std::vector<tensor_id> temps_;         // values reruns made, to check before each op that reruns
  std::vector<std::int64_t> freed_at_;   // the step before whose op a rerun temp was freed
  std::vector<char> in_temps_;           // whether a tensor is in temps_
  sim_result r_;
  std::priority_queue<free_entry, std::vector<free_entry>, std::greater<>> frees_;
  address_clock addresses_;  // with a layout (Note [Addresses in the replay])
  std::uint64_t device_cur_ = 0;
  tier_gauge host_{"host tier", hw_.host_bytes};
  tier_gauge nvme_{"NVMe tier", hw_.nvme_bytes};
  double host_free_ = 0;  // the host queue (program order) is free from
  double mem_clock_ = 0, h2d_free_ = 0, d2h_free_ = 0, nvme_r_free_ = 0, nvme_w_free_ = 0, net_free_ = 0;
};

}  // namespace

sim_result simulate(const trace& t, const plan& p, const hw_profile& hw, const sim_options& opt) {
  return simulate(t, analyze(t), p, hw, opt);
}

sim_result simulate(const trace& t, const lifetime_report& r, const plan& p, const hw_profile& hw,
                    const sim_options& opt) {
  if (opt.comm && opt.comm->ranks > 1 && !opt.comm->collectives.empty() && !hw.has_network())
    throw config_error("hardware profile '" + hw.name + "' gives no network between ranks: set 'network_gbps' and "
                       "'network_latency_us' to simulate " + std::to_string(opt.comm->ranks) + " ranks");
  return replay(t, r, p, hw, opt).run();
}

}  // namespace spillway::offload
