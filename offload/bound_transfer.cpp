// The least link bytes per iteration, counted per use: every byte of every tensor taken as a
// page of its own, and the best eviction order for such pages (Note [Per-use transfer bound]).
#include "offload/bound_transfer.hpp"

#include <algorithm>
#include <queue>

namespace spillway::offload {

// Note [Per-use transfer bound]
// Take a plan P that keeps the budget B and repeats every iteration (it ends in the state it
// starts from). Cut every tensor into bytes and look at one byte at a time.
//
// H2D. Between two uses of a tensor x, at ops a < r, where op r reads x (or, for a persistent
// tensor whose first use reads it, from its last use to that first use in the next iteration),
// the value x holds is needed at r. If x is not allocated while some op in (a, r) runs, its
// value must come back before r: by an H2D of all its bytes, or by rerunning the op w that
// wrote it (Note [Recomputation]). A rerun before op k is allowed only while no op in (w, k)
// wrote one of w's reads: k <= u_w, the first op after w that writes one (detail::remake_until).
// So a value may be off during ops [a + 1, u_w - 1] at no cost, but if it is off while some op
// in [max(a + 1, u_w), r - 1] runs (the costly span; all of (a, r) when w is not recomputable
// or the value is older than the iteration), an H2D of its bytes follows before r. While op j
// runs the device holds its working set (ws_j bytes) and, in every byte of a costly span around
// j that the plan keeps, at most B in all. So with keep_i the bytes of span i kept on the device
// all through it, every plan gives a choice with
//     sum of keep_i over the spans around j  <=  B - ws_j   for every op j,   0 <= keep_i <= b_i,
// and moves at least sum of (b_i - keep_i) bytes H2D. The least of that sum over all such
// choices is a lower bound. Over a line of ops the least is found by a sweep: at each op, if the
// kept spans around it hold more than B - ws_j, cut the ones that end last, byte by byte
// (Belady's farthest next use, for pages of one byte). Exchange argument: if a best choice,
// equal to the sweep's before op j, cut a span ending at e instead of the span ending last at
// e* >= e, move the cut to e*: both cover j and e* covers every later op the other covers, so
// no op's load grows and the sum stays the same.
// The iteration is a cycle, the sweep works on a line: lay M iterations end to end (persistent
// spans join one iteration to the next) and let the line start in any state: a span counts
// when the read it ends at is on the line, and one that begins before the line is kept for
// free until it is cut. P run M times from its own start state is one such line plan, and each
// span it cuts is a copy in made on the line, so it moves at least the line's least, and M
// times P's bytes is at least that: P moves at least (least over the line) / M. The free start
// is worth at most B bytes, so the loss is at most B / M per iteration. M is 2 to 16, as many
// as keep the sweep to a few million spans.
// Also, at any one op j the bytes of costly spans around j beyond B - ws_j are off at once, each
// a different tensor, so each of them comes back once per iteration: H2D >= max_j of that.
//
// D2H. A value written by op w (in this iteration) and read later (up to its last read e before
// the next write; a persistent value the next iteration reads lives to that first read) exists
// only on the device until copied out. If it is off while an op in its costly span
// [max(w + 1, u_w), e - 1] runs, it was copied out before (no rerun can make it again). Each
// value needs at most one copy out, so the least D2H bytes are the least bytes of such spans
// that are not kept all through: the same packing with the spans of values. Inside such a span
// the value is in the working set at its reads; the capacity at op j becomes B - ws_j + (bytes
// in ws_j whose value span is around j), which every plan meets (a kept value read at j is
// counted once, in the span), so it is still a relaxation. On the line a span counts when its
// value was written on it and it ends on it (the copy out then falls on the line too); a value
// written before the line owes nothing there. Per iteration: (least over the line) / M again.
//
// NVMe. At one op, the costly bytes off beyond what the host tier holds are on NVMe; they are
// read from it (and, for the D2H ones, written to it) once per iteration.
//
// What is relaxed: a tensor may be partly on the device; a value that leaves and comes back
// several times is charged once; memory is checked only while ops run (not when prefetches are
// issued or copies drain); a rerun's reads need not be resident and its compute is free; the
// cycle is cut (B / M per iteration at most); a D2H and an H2D are counted in separate choices.
// With persistent_only, every transient value is free (its spans are left out): a floor for
// what the model state alone must move.

namespace detail {

std::vector<op_index> remake_until(const trace& t, const lifetime_report& r) {
  const auto n = static_cast<op_index>(t.ops.size());
  std::vector<op_index> until(n, 0);
  for (op_index w = 0; w < n; ++w) {
    if (!t.ops[w].recomputable) continue;
    op_index u = n;
    for (tensor_id y : t.ops[w].reads) {
      const auto& uses = r.tensors[y].uses;
      auto it = std::upper_bound(uses.begin(), uses.end(), w, [](op_index v, const tensor_use& x) { return v < x.op; });
      for (; it != uses.end() && it->op < u; ++it)
        if (it->writes) {
          u = it->op;
          break;
        }
    }
    until[w] = u;
  }
  return until;
}

}  // namespace detail

namespace {

// Ops [lo, hi] of a cycle of n ops: 0 <= lo < n, lo <= hi < lo + n; hi >= n runs into the next
// iteration.
struct span {
  std::int64_t lo, hi;
  std::uint64_t bytes;
  bool written_before = false;  // D2H: the value was written in the iteration before lo's
};

struct span_set {
  std::vector<span> spans;
  std::vector<std::uint64_t> in_ws;  // per op: bytes of its working set whose span is around it
};

std::uint64_t over(std::uint64_t v, std::uint64_t cap) { return v > cap ? v - cap : 0; }

// Adds the costly span [lo, hi] (lo may be negative: the previous iteration).
void push_span(std::vector<span>& out, std::int64_t lo, std::int64_t hi, std::uint64_t b, std::int64_t n) {
  if (lo > hi || b == 0) return;
  if (lo < 0) {
    lo += n;
    hi += n;
  }
  out.push_back({lo, hi, b, false});
}

span_set h2d_spans(const trace& t, const lifetime_report& r, const std::vector<op_index>& until, bool persistent_only) {
  const auto n = static_cast<std::int64_t>(t.ops.size());
  span_set s;
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    const auto& lt = r.tensors[x];
    const bool persistent = is_persistent(t.tensors[x].kind);
    if (!lt.used() || (persistent_only && !persistent)) continue;
    const auto b = t.tensors[x].bytes;
    std::int64_t writer = -1;  // op that wrote the value x holds; -1: older than the iteration
    for (std::size_t k = 0; k < lt.uses.size(); ++k) {
      const auto& u = lt.uses[k];
      if (u.reads) {
        if (k == 0) {
          if (lt.crosses_boundary) push_span(s.spans, static_cast<std::int64_t>(lt.uses.back().op) - n + 1,
                                             static_cast<std::int64_t>(u.op) - 1, b, n);
        } else {
          std::int64_t lo = lt.uses[k - 1].op + 1;
          if (writer >= 0 && until[writer] > 0) lo = std::max<std::int64_t>(lo, until[writer]);
          push_span(s.spans, lo, static_cast<std::int64_t>(u.op) - 1, b, n);
        }
      }
      if (u.writes) writer = u.op;
    }
  }
  return s;
}

span_set d2h_spans(const trace& t, const lifetime_report& r, const std::vector<op_index>& until, bool persistent_only) {
  const auto n = static_cast<std::int64_t>(t.ops.size());
  span_set s;
  s.in_ws.assign(t.ops.size(), 0);
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    const auto& lt = r.tensors[x];
    const bool persistent = is_persistent(t.tensors[x].kind);
    if (!lt.used() || (persistent_only && !persistent)) continue;
    const auto b = t.tensors[x].bytes;
    const auto& uses = lt.uses;
    for (std::size_t k = 0; k < uses.size(); ++k) {
      if (!uses[k].writes) continue;
      const std::int64_t w = uses[k].op;
      std::int64_t e = -1;
      std::size_t j = k + 1;
      for (; j < uses.size(); ++j) {
        if (uses[j].reads) e = uses[j].op;
        if (uses[j].writes) break;
      }
      if (j == uses.size() && lt.crosses_boundary) e = static_cast<std::int64_t>(uses.front().op) + n;
      if (e < 0) continue;
      std::int64_t lo = w + 1;
      if (until[w] > 0) lo = std::max<std::int64_t>(lo, until[w]);
      const std::int64_t hi = e - 1;
      if (lo > hi || b == 0) continue;
      s.spans.push_back(lo < n ? span{lo, hi, b, false} : span{lo - n, hi - n, b, true});
      for (std::size_t i = k + 1; i < uses.size() && uses[i].op <= hi; ++i)
        if (uses[i].op >= lo) s.in_ws[uses[i].op] += b;
    }
  }
  return s;
}

// Per op of the cycle: bytes of spans around it.
std::vector<std::uint64_t> cover(const std::vector<span>& spans, std::size_t n) {
  std::vector<std::int64_t> d(2 * n + 1, 0);
  for (const auto& s : spans) {
    d[static_cast<std::size_t>(s.lo)] += static_cast<std::int64_t>(s.bytes);
    d[static_cast<std::size_t>(s.hi) + 1] -= static_cast<std::int64_t>(s.bytes);
  }
  std::vector<std::uint64_t> c(n, 0);
  std::int64_t acc = 0;
  for (std::size_t i = 0; i < 2 * n; ++i) {
    acc += d[i];
    c[i % n] += static_cast<std::uint64_t>(acc);
  }
  return c;
}

// The sweep of the note over `iters` iterations laid end to end: the least bytes of spans cut.
// cap[j]: what spans around op j may hold. For H2D (copies_in), a span counts when the read it
// ends at is on the line, and one that begins before the line is kept for free until cut; for
// D2H, a span counts when its value was written on the line and it ends there.
std::uint64_t least_cut(const std::vector<span>& spans, const std::vector<std::int64_t>& cap, std::size_t iters,
                        bool copies_in) {
  const auto n = static_cast<std::int64_t>(cap.size());
  if (n == 0 || spans.empty()) return 0;
  std::vector<std::vector<std::uint32_t>> by_start(cap.size());
  for (std::uint32_t i = 0; i < spans.size(); ++i) by_start[static_cast<std::size_t>(spans[i].lo)].push_back(i);
  using entry = std::pair<std::int64_t, std::uint32_t>;  // end, instance
  std::priority_queue<entry> last;                                                 // cut first
  std::priority_queue<entry, std::vector<entry>, std::greater<>> first;            // leave first
  std::vector<std::uint64_t> kept;
  std::uint64_t held = 0, cut = 0;
  const std::int64_t line_end = n * static_cast<std::int64_t>(iters);
  auto add = [&](std::int64_t end, std::uint64_t b) {
    const auto id = static_cast<std::uint32_t>(kept.size());
    kept.push_back(b);
    held += b;
    last.push({end, id});
    first.push({end, id});
  };
  for (std::int64_t pos = 0; pos < line_end; ++pos) {
    const std::int64_t j = pos % n, base = pos - j;
    while (!first.empty() && first.top().first < pos) {
      held -= kept[first.top().second];
      kept[first.top().second] = 0;
      first.pop();
    }
    if (pos == 0 && copies_in)
      for (const auto& s : spans)
        if (s.hi >= n) add(s.hi - n, s.bytes);
    for (std::uint32_t i : by_start[static_cast<std::size_t>(j)]) {
      const auto& s = spans[i];
      const std::int64_t end = base + s.hi;
      // The read after a span is at end + 1; one past the line costs nothing on it.
      if (copies_in ? end + 1 < line_end : end < line_end && !(base == 0 && s.written_before)) add(end, s.bytes);
    }
    const auto room = static_cast<std::uint64_t>(std::max<std::int64_t>(0, cap[static_cast<std::size_t>(j)]));
    while (held > room) {
      const auto id = last.top().second;
      const std::uint64_t take = std::min(kept[id], held - room);
      kept[id] -= take;
      held -= take;
      cut += take;
      if (kept[id] == 0) last.pop();
    }
  }
  return cut;
}

}  // namespace

transfer_floor least_transfers(const trace& t, const lifetime_report& r, std::uint64_t budget, std::uint64_t host_bytes,
                               const transfer_floor_options& opt) {
  transfer_floor f;
  const std::size_t n = t.ops.size();
  if (n == 0) return f;
  const auto until = detail::remake_until(t, r);
  const auto h = h2d_spans(t, r, until, opt.persistent_only);
  const auto d = d2h_spans(t, r, until, opt.persistent_only);
  const auto cov_h = cover(h.spans, n), cov_d = cover(d.spans, n);
  std::vector<std::int64_t> cap_h(n), cap_d(n);
  for (std::size_t j = 0; j < n; ++j) {
    const auto ws = r.working_set_bytes[j];
    cap_h[j] = static_cast<std::int64_t>(budget) - static_cast<std::int64_t>(ws);
    cap_d[j] = cap_h[j] + static_cast<std::int64_t>(d.in_ws[j]);
    // One op: what is off at once (the note's last H2D paragraph, and the same for D2H).
    const auto off_h = over(ws + cov_h[j], budget), off_d = over(ws - d.in_ws[j] + cov_d[j], budget);
    f.h2d_bytes = std::max(f.h2d_bytes, off_h);
    f.d2h_bytes = std::max(f.d2h_bytes, off_d);
    f.nvme_read_bytes = std::max(f.nvme_read_bytes, over(off_h, host_bytes));
    f.nvme_write_bytes = std::max(f.nvme_write_bytes, over(off_d, host_bytes));
  }
  std::size_t iters = opt.iterations;
  if (iters == 0) {
    // Work grows with iterations x spans; more iterations lose less to the free start.
    const std::size_t spans = std::max<std::size_t>(1, h.spans.size() + d.spans.size());
    iters = std::clamp<std::size_t>(2'000'000 / spans, 2, 16);
  }
  f.h2d_bytes = std::max(f.h2d_bytes, least_cut(h.spans, cap_h, iters, true) / iters);
  f.d2h_bytes = std::max(f.d2h_bytes, least_cut(d.spans, cap_d, iters, false) / iters);
  return f;
}

}  // namespace spillway::offload
