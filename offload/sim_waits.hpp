// Where a simulated step's time goes: the waits of the compute stream and the copies behind
// them, and how busy the compute stream and each copy engine are in each phase of the
// iteration. Read from a timeline the simulator recorded (sim_options::record_timeline); the
// planners use the waits to decide what to remake (Note [Recomputing planners]), the bench
// prints both (spillway-bench plan --waits).
#pragma once

#include <string_view>
#include <vector>

#include "offload/simulator.hpp"

namespace spillway::offload {

/// A wait of the compute stream (the gap before an op or a rerun starts) and the copies, in or
/// out, that ended as it started: it waited for the copy or for the memory the copy freed.
struct compute_wait {
  double seconds = 0;
  op_index op = 0;     ///< the op that waited, or the op rerun
  bool rerun = false;
  std::vector<tensor_id> copies;  ///< the tensors copied
  std::vector<sim_track> tracks;  ///< per copy: h2d, d2h, nvme_read or nvme_write
  double at = 0;                  ///< when the op started (the wait's end)
};
/// The waits of at least `least` seconds in `s`'s timeline, longest first; waits that no copy
/// ends are left out.
std::vector<compute_wait> waited_copies(const sim_result& s, double least);

/// The tensors whose copies held up `w`'s copy `i` (of w.copies): those that ran before it on
/// its track back to back with it (the stretch that track was busy without a break up to that
/// copy; a queue serves one copy at a time, so the copy would have ended that much sooner without
/// them), latest first, each once, `w`'s own copies left out.
std::vector<tensor_id> copies_ahead(const sim_result& s, const compute_wait& w, std::size_t i);

/// The rate of the copy queue `track` (h2d, d2h, nvme_read or nvme_write) on `hw`, bytes per
/// second; 0 for a track that is no copy queue.
double copy_bytes_per_second(const hw_profile& hw, sim_track track);

/// One phase of the iteration and the seconds, within it, that each stream was busy.
struct phase_use {
  std::string_view name;  ///< "forward", "backward", "after" (the rest of the step) or "step"
  double start = 0, end = 0;
  double compute = 0;  ///< ops and reruns
  double h2d = 0, d2h = 0;
};
/// `s`'s step cut at the end of the last forward op and at the end of the last backward op (by
/// op_desc::phase), each part with what its streams did; one part, "step", for a trace that
/// names no forward or backward op. Parts of no length are left out.
std::vector<phase_use> phase_uses(const trace& t, const sim_result& s);

}  // namespace spillway::offload
