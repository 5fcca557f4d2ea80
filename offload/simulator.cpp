// Simulator: an in-order replay of one iteration (Note [Simulator model]) and the reference
// times every result carries (Note [Lower bound]).
#include "offload/simulator.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <tuple>

#include "device/units.hpp"

namespace spillway::offload {

std::string_view to_string(sim_track t) noexcept {
  constexpr std::string_view names[] = {"compute", "h2d", "d2h", "nvme_read", "nvme_write"};
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
};

class replay {
 public:
  replay(const trace& t, const lifetime_report& lt, const plan& p, const hw_profile& hw, const sim_options& opt)
      : t_(t), p_(p), hw_(hw), opt_(opt), lt_(lt), st_(t.tensors.size()) {}

  sim_result run() {
    p_.validate(t_);
    start_state();
    const std::size_t n = t_.ops.size();
    double boundary = 0;
    for (op_index k = 0; k < n; ++k) {
      if (k > 0) issue_evictions(k - 1, boundary);
      for (const auto& pf : p_.steps[k].prefetches) issue_prefetch(pf, k, boundary);
      boundary = run_op(k, boundary);
    }
    if (n > 0) issue_evictions(static_cast<op_index>(n - 1), boundary);
    double end = boundary;
    end = std::max({end, h2d_free(), d2h_free(), nvme_r_free_, nvme_w_free_});
    while (!frees_.empty()) {
      end = std::max(end, frees_.top().first);
      release_until(frees_.top().first);
    }
    end_state();
    r_.step_seconds = end;
    r_.stall_seconds = std::max(0.0, end - r_.compute_seconds);
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
  };
  std::string describe(const reason& w) const {
    switch (w.kind) {
      case reason::prefetch: return "prefetch of '" + name(w.x) + "' before " + op_label(w.op);
      case reason::writes: return op_label(w.op) + " writing '" + name(w.x) + "'";
      default: return op_label(w.op) + " reads '" + name(w.x) + "'";
    }
  }

  // True when some later op (or, for tensors crossing the boundary, the next iteration) reads
  // the value the tensor holds after op `k`.
  bool value_needed_after(tensor_id x, op_index k) const {
    const auto& uses = lt_.tensors[x].uses;
    auto it = std::upper_bound(uses.begin(), uses.end(), k, [](op_index v, const tensor_use& u) { return v < u.op; });
    if (it != uses.end()) return it->reads;
    return lt_.tensors[x].crosses_boundary;
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

  void hold_host(tensor_id x) {
    if (st_[x].host_held) return;
    st_[x].host_held = true;
    host_cur_ += bytes(x);
    r_.peak_host_bytes = std::max(r_.peak_host_bytes, host_cur_);
    if (host_cur_ > hw_.host_bytes && !host_over_) {
      host_over_ = true;
      violation("host tier over its capacity of " + format_bytes(hw_.host_bytes) + " when '" + name(x) + "' arrives");
    }
  }
  void hold_nvme(tensor_id x) {
    if (st_[x].nvme_held) return;
    st_[x].nvme_held = true;
    nvme_cur_ += bytes(x);
    r_.peak_nvme_bytes = std::max(r_.peak_nvme_bytes, nvme_cur_);
    if (nvme_cur_ > hw_.nvme_bytes && !nvme_over_) {
      nvme_over_ = true;
      violation("NVMe tier over its capacity of " + format_bytes(hw_.nvme_bytes) + " when '" + name(x) + "' arrives");
    }
  }
  void release_tiers(tensor_id x) {
    auto& s = st_[x];
    if (s.host_held) host_cur_ -= bytes(x);
    if (s.nvme_held) nvme_cur_ -= bytes(x);
    s.host_held = s.nvme_held = s.host_valid = s.nvme_valid = false;
  }

  void start_state() {
    for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
      const auto& d = t_.tensors[x];
      if (!is_persistent(d.kind)) continue;
      const tier home = p_.initial_tier[x];
      auto& s = st_[x];
      if (home == tier::device) {
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

  void issue_evictions(op_index k, double at) {
    for (const auto& e : p_.steps[k].evictions) {
      auto& s = st_[e.tensor];
      const auto b = bytes(e.tensor);
      if (!s.on_device) {
        violation("after " + op_label(k) + ": evicts '" + name(e.tensor) + "', which is not on the device");
        continue;
      }
      const bool needed = value_needed_after(e.tensor, k);
      evict_action action = e.action;
      if ((action == evict_action::evict_to_host && s.host_valid) ||
          (action == evict_action::evict_to_nvme && s.nvme_valid))
        action = evict_action::drop;  // the tier already holds this value
      if (action == evict_action::drop) {
        if (needed && s.device_valid && !s.host_valid && !s.nvme_valid)
          violation("after " + op_label(k) + ": drops '" + name(e.tensor) + "', whose value is needed later and has no copy");
        if (!needed) release_tiers(e.tensor);
        frees_.push({at, b});
      } else {
        const double start = std::max({at, d2h_free_, s.ready});
        const double end = start + static_cast<double>(b) / hw_.d2h_bytes_per_s;
        d2h_free_ = end;
        r_.d2h_bytes += b;
        event(sim_track::d2h, e.tensor, start, end, b);
        frees_.push({end, b});
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
    }
  }

  // Copies the tensor's value from `from` into freshly taken device memory; returns its ready time.
  double fetch(tensor_id x, tier from, double at, const reason& why) {
    auto& s = st_[x];
    const auto b = bytes(x);
    const double alloc_at = allocate(b, at, why);
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
    fetch(pf.tensor, pf.from, at, why);
  }

  double run_op(op_index k, double boundary) {
    const auto& op = t_.ops[k];
    double start = boundary;
    auto need = [&](tensor_id x, bool reads) {
      auto& s = st_[x];
      if (s.on_device) {
        start = std::max(start, s.ready);
        return;
      }
      if (!reads) {
        start = std::max(start, allocate(bytes(x), boundary, reason{reason::writes, k, x}));
        s.on_device = true;
        s.ready = 0;
        return;
      }
      const reason why{reason::reads, k, x};
      if (!s.host_valid && !s.nvme_valid) {
        violation(describe(why) + ", whose value was lost");
        start = std::max(start, allocate(bytes(x), boundary, why));
        s.on_device = true;
        return;
      }
      violation(describe(why) + ", which is not resident and was not prefetched (fetched on demand)");
      ++r_.on_demand_fetches;
      start = std::max(start, fetch(x, s.host_valid ? tier::host : tier::nvme, boundary, why));
    };
    for (tensor_id x : op.reads) need(x, true);
    for (tensor_id x : op.writes)
      if (std::find(op.reads.begin(), op.reads.end(), x) == op.reads.end()) need(x, false);
    const double dur = hw_.op_seconds(op);
    const double end = start + dur;
    r_.compute_seconds += dur;
    event(sim_track::compute, k, start, end, 0);
    for (tensor_id x : op.writes) {
      auto& s = st_[x];
      s.device_valid = true;
      release_tiers(x);  // copies elsewhere are stale now
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
  sim_result r_;
  std::priority_queue<free_entry, std::vector<free_entry>, std::greater<>> frees_;
  std::uint64_t device_cur_ = 0, host_cur_ = 0, nvme_cur_ = 0;
  bool host_over_ = false, nvme_over_ = false;
  double mem_clock_ = 0, h2d_free_ = 0, d2h_free_ = 0, nvme_r_free_ = 0, nvme_w_free_ = 0;
};

}  // namespace

sim_result simulate(const trace& t, const plan& p, const hw_profile& hw, const sim_options& opt) {
  const auto lt = analyze(t);
  return replay(t, lt, p, hw, opt).run();
}

sim_result simulate(const trace& t, const lifetime_report& r, const plan& p, const hw_profile& hw,
                    const sim_options& opt) {
  return replay(t, r, p, hw, opt).run();
}

namespace {

// Family (2) of Note [Lower bound]: the order bound around op j, for every j in one sweep.
class order_bound {
 public:
  order_bound(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget)
      : t_(t), r_(r), hw_(hw), budget_(budget), n_(t.ops.size()) {
    dur_.resize(n_);
    before_.assign(n_ + 1, 0);  // before_[k]: compute of ops < k
    for (std::size_t k = 0; k < n_; ++k) {
      dur_[k] = hw.op_seconds(t.ops[k]);
      before_[k + 1] = before_[k] + dur_[k];
    }
  }

  // Returns {seconds, op}.
  std::pair<double, op_index> run() {
    const std::size_t nt = t_.tensors.size();
    std::vector<std::size_t> next(nt, 0);  // index of the first use at an op > j (after advancing)
    std::vector<std::int64_t> last_write(nt, -1), final_write(nt, -1);
    for (tensor_id x = 0; x < nt; ++x)
      for (const auto& u : r_.tensors[x].uses)
        if (u.writes) final_write[x] = u.op;
    std::vector<char> touched(nt, 0);
    double best = 0;
    op_index best_op = 0;
    for (op_index j = 0; j < n_; ++j) {
      const auto& op = t_.ops[j];
      for (tensor_id x : op.reads) touched[x] = 1;
      for (tensor_id x : op.writes) touched[x] = 1;
      std::uint64_t needed = r_.working_set_bytes[j], free_d = 0, free_h = 0;
      d_.clear();
      h_.clear();
      l_.clear();
      std::uint64_t late_total = 0;
      for (tensor_id x = 0; x < nt; ++x) {
        const auto& lt = r_.tensors[x];
        if (touched[x] || !lt.used()) continue;
        const std::uint64_t b = t_.tensors[x].bytes;
        const bool has_next = next[x] < lt.uses.size();
        const bool is_needed = has_next ? lt.uses[next[x]].reads : lt.crosses_boundary;
        if (!is_needed) continue;
        needed += b;
        if (last_write[x] >= 0) {
          d_.push_back({static_cast<std::size_t>(last_write[x]), b});
        } else {
          free_d += b;
          if (lt.crosses_boundary && final_write[x] > static_cast<std::int64_t>(j)) {
            l_.push_back({static_cast<std::size_t>(final_write[x]), b});
            late_total += b;
          }
        }
        if (has_next)
          h_.push_back({lt.uses[next[x]].op, b});
        else
          free_h += b;
      }
      if (needed > budget_) {
        const std::uint64_t off = needed - budget_;
        const double dmin = d2h_before(off > free_d ? off - free_d : 0);
        const double hmin = h2d_after(off > free_h ? off - free_h : 0);
        const double after = before_[n_] - before_[j + 1];
        const double at_start = std::max(before_[j], dmin) + std::max(dur_[j] + after, hmin);
        const double at_end = std::max(before_[j + 1], dmin) + std::max(after, hmin);
        const double v = std::max({at_start, at_end, late_chain(j, off, free_d - late_total, free_h, late_total)});
        if (v > best) {
          best = v;
          best_op = j;
        }
      }
      for (tensor_id x : op.reads) touched[x] = 0;
      for (tensor_id x : op.writes) touched[x] = 0;
      auto advance = [&](tensor_id x) {
        const auto& uses = r_.tensors[x].uses;
        while (next[x] < uses.size() && uses[next[x]].op <= j) {
          if (uses[next[x]].writes) last_write[x] = uses[next[x]].op;
          ++next[x];
        }
      };
      for (tensor_id x : op.reads) advance(x);
      for (tensor_id x : op.writes) advance(x);
    }
    return {best, best_op};
  }

 private:
  struct item {
    std::size_t op;  // the write before (d_) or the read after (h_)
    std::uint64_t bytes;
  };

  // Least time the D2H queue needs to have copied out `need` bytes of values written at the ops
  // in d_ (each copy starts after its op ends, so after the compute up to it): the earliest
  // written ones, a part of the last one.
  double d2h_before(std::uint64_t need) {
    return least(d_, need, false, hw_.d2h_bytes_per_s, [&](std::size_t w) { return before_[w + 1]; });
  }

  // Least time from the moment `need` bytes are off to the end of the step when they must come
  // back before their reads at the ops in h_ (the H2D of what op k reads ends before op k
  // starts, and ops k.. still run): the ones read latest, a part of the first one.
  double h2d_after(std::uint64_t need) {
    return least(h_, need, true, hw_.h2d_bytes_per_s, [&](std::size_t r) { return before_[n_] - before_[r]; });
  }

  // Part (c) of the order bound at the start of op j: `off` bytes are off, `free` of them may
  // owe no copy out at all, and up to `late` bytes (l_) are values of the previous iteration
  // that the iteration writes again and the next one reads: each either copied out before op j
  // (with the values of d_) or copied out after its last write. Takes the least over how many
  // bytes go late, on a grid: the pre side falls and the late side grows with them.
  double late_chain(op_index j, std::uint64_t off, std::uint64_t free, std::uint64_t free_h, std::uint64_t late) {
    if (late == 0) return 0;
    std::sort(d_.begin(), d_.end(), [](const item& a, const item& b) { return a.op < b.op; });
    std::sort(h_.begin(), h_.end(), [](const item& a, const item& b) { return a.op < b.op; });
    std::sort(l_.begin(), l_.end(), [](const item& a, const item& b) { return a.op < b.op; });
    const double after = before_[n_] - before_[j + 1];
    constexpr int grid = 8;
    double best = std::numeric_limits<double>::infinity();
    double h_prev = h2d_with_late(off, free_h, 0);
    for (int i = 0; i < grid; ++i) {
      const double lam_hi = static_cast<double>(late) * (i + 1) / grid;
      const double d = d2h_with_pre(static_cast<double>(off) - static_cast<double>(free) - lam_hi,
                                    static_cast<double>(late) - lam_hi);
      const double at_start = std::max(before_[j], d) + std::max(dur_[j] + after, h_prev);
      const double at_end = std::max(before_[j + 1], d) + std::max(after, h_prev);
      best = std::min(best, std::max(at_start, at_end));
      h_prev = h2d_with_late(off, free_h, lam_hi);
    }
    return best;
  }

  // Least D2H time before the instant when `need` bytes must have been copied out: up to `pre`
  // of them held since before the iteration (ready once op 0 ends: an eviction follows an op),
  // the rest values in d_ (sorted by the op that wrote them), earliest written first.
  double d2h_with_pre(double need, double pre) const {
    if (need <= 0) return 0;
    const double bw = hw_.d2h_bytes_per_s;
    double rest = need - std::min(pre, need), out = before_[1] + need / bw;  // copies out follow op 0
    double taken = 0;
    std::vector<double> take;
    for (const auto& it : d_) {
      if (taken >= rest) break;
      take.push_back(std::min(static_cast<double>(it.bytes), rest - taken));
      taken += take.back();
    }
    double suffix = taken;
    for (std::size_t i = 0; i < take.size(); ++i) {
      out = std::max(out, before_[d_[i].op + 1] + suffix / bw);
      suffix -= take[i];
    }
    return out;
  }

  // Least time from the instant to the end of the step when the `off` bytes (less `free_h`
  // that need no copy in) come back before their reads (h_, latest read first) and `lam`
  // bytes of l_ (earliest last write first) are copied out after their last write: for every
  // op k, the copies in of what ops <= k read end before op k starts; after that start the
  // compute from k still runs, and so do op k and then the copies out of what ops >= k last
  // write (those copies start when their writing op ends, at or after the end of op k).
  double h2d_with_late(std::uint64_t off, std::uint64_t free_h, double lam) const {
    const double need = off > free_h ? static_cast<double>(off - free_h) : 0.0;
    double avail_after = 0;  // bytes of h_ read after k
    for (const auto& it : h_) avail_after += static_cast<double>(it.bytes);
    double late_before = 0;  // bytes of l_ last written before k
    double out = 0;
    std::size_t hi = 0, li = 0;
    while (hi < h_.size() || li < l_.size()) {
      const std::size_t k = li >= l_.size() || (hi < h_.size() && h_[hi].op <= l_[li].op) ? h_[hi].op : l_[li].op;
      while (hi < h_.size() && h_[hi].op <= k) avail_after -= static_cast<double>(h_[hi++].bytes);
      const double in = std::max(0.0, need - avail_after);
      const double late_here = std::max(0.0, lam - late_before);
      out = std::max(out, in / hw_.h2d_bytes_per_s +
                              std::max(before_[n_] - before_[k], dur_[k] + late_here / hw_.d2h_bytes_per_s));
      while (li < l_.size() && l_[li].op <= k) late_before += static_cast<double>(l_[li++].bytes);
    }
    return out;
  }

  // Takes `need` bytes of `v` in op order (latest first when `latest`), and returns the largest
  // fixed(op_i) + (bytes taken at i and after)/bw over the items taken.
  template <class F>
  static double least(std::vector<item>& v, std::uint64_t need, bool latest, double bw, F fixed) {
    if (need == 0) return 0;
    std::sort(v.begin(), v.end(), [latest](const item& a, const item& b) { return latest ? a.op > b.op : a.op < b.op; });
    std::size_t m = 0;
    std::uint64_t got = 0;
    while (m < v.size() && got < need) got += v[m++].bytes;
    double out = 0, rest = static_cast<double>(std::min(got, need));
    for (std::size_t i = 0; i < m && rest > 0; ++i) {
      out = std::max(out, fixed(v[i].op) + rest / bw);
      rest -= static_cast<double>(v[i].bytes);
    }
    return out;
  }

  const trace& t_;
  const lifetime_report& r_;
  const hw_profile& hw_;
  std::uint64_t budget_;
  std::size_t n_;
  std::vector<double> dur_, before_;
  std::vector<item> d_, h_, l_;
};

}  // namespace

bounds compute_bounds(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) {
  bounds b;
  for (const auto& op : t.ops) b.ideal_seconds += hw.op_seconds(op);
  auto over = [](std::uint64_t v, std::uint64_t cap) { return v > cap ? v - cap : 0; };
  for (std::size_t j = 0; j < t.ops.size(); ++j) {
    const auto n = r.needed_bytes_during[j];
    const auto w = r.needed_written_bytes_during[j];
    b.h2d_min_bytes = std::max(b.h2d_min_bytes, over(n, budget));
    b.d2h_min_bytes = std::max(b.d2h_min_bytes, over(w, budget));
    b.nvme_read_min_bytes = std::max(b.nvme_read_min_bytes, over(over(n, budget), hw.host_bytes));
    b.nvme_write_min_bytes = std::max(b.nvme_write_min_bytes, over(over(w, budget), hw.host_bytes));
  }
  const double h2d = static_cast<double>(b.h2d_min_bytes) / hw.h2d_bytes_per_s;
  const double d2h = static_cast<double>(b.d2h_min_bytes) / hw.d2h_bytes_per_s;
  const double link = hw.copy_engines >= 2 ? std::max(h2d, d2h) : h2d + d2h;
  b.volume_bound_seconds = std::max({link, static_cast<double>(b.nvme_read_min_bytes) / hw.nvme_read_bytes_per_s,
                                     static_cast<double>(b.nvme_write_min_bytes) / hw.nvme_write_bytes_per_s});
  std::tie(b.order_bound_seconds, b.order_bound_op) = order_bound(t, r, hw, budget).run();
  b.lower_bound_seconds = std::max({b.ideal_seconds, b.volume_bound_seconds, b.order_bound_seconds});
  return b;
}

}  // namespace spillway::offload
