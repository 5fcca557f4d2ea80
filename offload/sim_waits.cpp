// The waits of a simulated compute stream and the use of each stream by phase (offload/sim_waits.hpp).
#include "offload/sim_waits.hpp"

#include <algorithm>

namespace spillway::offload {

std::vector<compute_wait> waited_copies(const sim_result& s, double least) {
  std::vector<const sim_event*> ops, copies;
  for (const auto& e : s.timeline) {
    if (e.track == sim_track::compute || e.track == sim_track::recompute) ops.push_back(&e);
    else if (e.track == sim_track::h2d || e.track == sim_track::d2h || e.track == sim_track::nvme_read ||
             e.track == sim_track::nvme_write)
      copies.push_back(&e);
  }
  std::sort(ops.begin(), ops.end(), [](auto* a, auto* b) { return a->start < b->start; });
  std::sort(copies.begin(), copies.end(), [](auto* a, auto* b) { return a->end < b->end; });
  std::vector<compute_wait> waits;
  double free_at = 0;
  for (const auto* e : ops) {
    const double gap = e->start - free_at;
    free_at = std::max(free_at, e->end);
    if (gap < least) continue;
    constexpr double same = 1e-9;
    auto it = std::lower_bound(copies.begin(), copies.end(), e->start - same,
                               [](const sim_event* c, double v) { return c->end < v; });
    compute_wait w{gap, e->id, e->track == sim_track::recompute, {}, {}, e->start};
    for (; it != copies.end() && (*it)->end <= e->start + same; ++it) {
      w.copies.push_back((*it)->id);
      w.tracks.push_back((*it)->track);
    }
    if (!w.copies.empty()) waits.push_back(std::move(w));
  }
  std::stable_sort(waits.begin(), waits.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  return waits;
}

std::vector<tensor_id> copies_ahead(const sim_result& s, const compute_wait& w, std::size_t i) {
  constexpr double same = 1e-9;
  std::vector<const sim_event*> track;
  for (const auto& e : s.timeline)
    if (e.track == w.tracks[i] && e.end <= w.at + same) track.push_back(&e);
  std::sort(track.begin(), track.end(), [](auto* a, auto* b) { return a->start < b->start; });
  // The waited copy: the last of its tensor on this track to end by the time the op started.
  const auto last = std::find_if(track.rbegin(), track.rend(), [&](const sim_event* e) { return e->id == w.copies[i]; });
  std::vector<tensor_id> out;
  if (last == track.rend()) return out;
  double from = (*last)->start;
  for (auto it = std::next(last); it != track.rend() && (*it)->end >= from - same; ++it) {
    from = std::min(from, (*it)->start);
    const tensor_id x = (*it)->id;
    if (std::find(w.copies.begin(), w.copies.end(), x) == w.copies.end() && std::find(out.begin(), out.end(), x) == out.end())
      out.push_back(x);
  }
  return out;
}

double copy_bytes_per_second(const hw_profile& hw, sim_track track) {
  switch (track) {
    case sim_track::h2d:
      return hw.h2d_bytes_per_s;
    case sim_track::d2h:
      return hw.d2h_bytes_per_s;
    case sim_track::nvme_read:
      return hw.nvme_read_bytes_per_s;
    case sim_track::nvme_write:
      return hw.nvme_write_bytes_per_s;
    default:
      return 0;
  }
}

std::vector<phase_use> phase_uses(const trace& t, const sim_result& s) {
  double forward_end = -1, backward_end = -1;
  for (const auto& e : s.timeline) {
    if (e.track != sim_track::compute && e.track != sim_track::host) continue;
    const auto phase = t.ops[e.id].phase;
    if (phase == op_phase::forward) forward_end = std::max(forward_end, e.end);
    if (phase == op_phase::backward) backward_end = std::max(backward_end, e.end);
  }
  std::vector<phase_use> parts;
  if (forward_end < 0 && backward_end < 0) {
    parts.push_back({"step", 0, s.step_seconds});
  } else {
    const double a = std::max(forward_end, 0.0), b = std::max(backward_end, a);
    for (phase_use p : {phase_use{"forward", 0, a}, phase_use{"backward", a, b}, phase_use{"after", b, s.step_seconds}})
      if (p.end > p.start) parts.push_back(p);
  }
  for (const auto& e : s.timeline) {
    for (auto& p : parts) {
      const double busy = std::max(0.0, std::min(e.end, p.end) - std::max(e.start, p.start));
      if (e.track == sim_track::compute || e.track == sim_track::recompute) p.compute += busy;
      if (e.track == sim_track::h2d) p.h2d += busy;
      if (e.track == sim_track::d2h) p.d2h += busy;
    }
  }
  return parts;
}

}  // namespace spillway::offload
