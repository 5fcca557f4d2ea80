// checkpoint, capuchin and auto's recomputation search (Note [Recomputing planners]).
#include "offload/planner_recompute.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include <oneapi/tbb/parallel_for.h>

#include "offload/bound_transfer.hpp"
#include "offload/plan_builder.hpp"
#include "offload/rerun_schedule.hpp"
#include "offload/sim_waits.hpp"
#include "offload/simulator.hpp"

namespace spillway::offload::detail {

// Note [Recomputing planners]
// Each picks the values to drop and remake, lets the rerun schedule place the reruns (Note
// [Rerun schedules]) and a swap planner plan the folded trace, and judges the result with the
// simulator on the real trace.
// checkpoint: activation checkpointing as PyTorch's checkpoint() does it: keep each value that
//   crosses a layer boundary (read by a forward op of another layer; layers from op_desc::layer,
//   or, where the trace has none, runs of about sqrt(n) recomputable ops, after Chen et al.),
//   remake every other one before the backward pass needs it, and swap what still does not fit
//   as lms does (persistent tensors included, so it keeps budgets the model state exceeds).
// capuchin: its rule (Peng et al., ASPLOS 2020): a value whose copy out and back fits in the
//   compute of its idle stretch is swapped; the others are remade, those that free the most
//   bytes per second of rerun first, as many as it takes (half or all are tried); the swaps
//   are placed by auto's sweep. The copies are timed on the link the model state leaves (on
//   h200 at 1/4 and 1/8 of their peak, the GPT models' steps 6-22% shorter for it: gpt2-small
//   at 1/4 103.4 -> 86.9 ms; bert-large at 1/8 13%; the other rows the same).
// auto: the fastest of its swap-only search, every baseline's plan (lms, vdnn, checkpoint,
//   capuchin), and plans that remake shares of checkpoint's values, swaps placed by a shorter
//   sweep search. Stage 1 remakes all of them. Where its best plan still spends more than 5%
//   of its step stalled or rerunning, stage 2 remakes 50 and 75% of them (90 and 95% too on
//   traces of up to planner_options::auto_fine_search_ops ops), taking first the single
//   reruns (values whose writer reads no other dropped value and which no other dropped
//   value's writer reads: each rerun stands alone, no chain) in order of bytes freed per
//   second of rerun, then the rest in that order: where memory is left, fewer and shorter
//   reruns; at 90 and 95% the few values least
//   worth a rerun are swapped instead (ResNet-152 at 1/4 of its peak on h200: 52.4 -> 47.1 ms).
//   Where the plan stalls more than 5%, stage 2 also tries the shares of
//   planner_options::auto_remake_shares in plain bytes-per-rerun-second order, checkpoint's
//   values over groups of 2 and 4 layers, or of two ops where the trace names no layers, and
//   chains that drop what they make early (Note [Rerun schedules]). auto's own plans spread
//   each chain over the ops before the one it serves (Note [Rerun schedules], spread chains),
//   so a chain holds two of its values at a time, not all; the stalling stage also tries
//   checkpoint's values with chains held whole. Stage 3, on traces of up to auto_fine_search_ops
//   ops, is Capuchin's rule applied to the best plan's own timeline: the copies its compute
//   still waits for (a value copied in too late, or one whose copy out must end before the
//   memory it frees is there) are made reruns where their values may be remade, the values
//   behind the longest waits first, added to the values the plan drops; a value the plan drops
//   and still copies (a chain made it early and kept it) is made again before its own read
//   instead (schedule_reruns' `again`); where no value behind a wait may be remade (model
//   state copied out to make room), values that may be remade and live over the op are
//   dropped, as many bytes as the copies move; each with the best plan's schedule settings
//   and with either flipped (VGG-16 at 1/2: 48.5 -> 28.1 ms, a chain held whole through the
//   first convolution's released output). Up to planner_options::auto_stall_rounds
//   rounds, each from the best plan so far (on h200, ResNet-50 at 1/8 of its peak: 79.6 ->
//   70.3 ms; ResNet-152 at 1/4: 40.4 -> 38.7, at 1/8: 61.9 -> 48.4, where rounds 7 and 8 gain
//   the last 1.4 ms and more rounds nothing; gpt2-large at 1/4: 107.7 -> 104.0). Last, the
//   best plan keeps 5, 10, 20 or 30% of the values it drops, those that free the fewest bytes
//   per second of rerun (gpt2-xl at 1/8: 219.2 -> 214.0 ms; where the
//   link has time left, a swap costs less than such a rerun). Stage 4, on the same traces:
//   the values the plan drops are changed one at a time, one value dropped that was kept or
//   kept that was dropped, in trace order, eight candidates at a time; the fastest of eight
//   that beats the plan becomes the plan, and the next eight start from it. It stops after
//   planner_options::auto_toggle_evaluations candidates (300) or when a whole round of the
//   values changes nothing. The earlier stages move many values by one rule; a single value's
//   change can end a wait that the rule does not see (on h200, ResNet-152 at 1/8 of its peak:
//   48.4 -> 42.1 ms; ResNet-50 at 1/4: 20.0 -> 17.7; the GPT-2 models 0-2%; planning takes
//   about 0.4-2.5 s per row on two cores in place of 0.1-0.3; 1,000 candidates gain under
//   1% more at up to three times the time). Each candidate's swaps come from a narrower sweep
//   search than the other stages' (toggle_search: one reserve, two late weights, every value
//   kept over the boundary, no late prefetches or homing), and the plan it must beat is the
//   best one's values planned the same way; the last plan the stage finds is planned once more
//   with the stage's usual search, and the fastest of the plans before and after wins. Planned
//   with the usual search, the candidates took about nine tenths of auto's time on the zoo's
//   rows at 1/4 and 1/8 on h200 (gpt2-large at 1/8: 11.5 s of planning, 1.4 s without stage 4);
//   narrowed, the 17 rows plan in 40.2 s in all instead of 90.1, each as fast or faster but
//   bert-large at 1/8 (95.38 -> 95.39 ms; gpt2-medium at 1/8 56.37 -> 56.29, gpt3-13b at 1/8
//   1379.30 -> 1377.74); on v100-16g at 1/2, 1/4 and 1/8, 27 rows in 39.8 s instead of 80.8,
//   each as fast or faster but bert-large at 1/8 (823.95 -> 824.37 ms; gpt2-large at 1/8 949.69
//   -> 943.63). The plan a Session follows for ResNet-50 at 1/8 on h200 (fit_plan's search down
//   a grid, Note [Untimed layouts]) takes 74.4 ms with its waits instead of 73.4, found in 29.0 s
//   instead of 46.6. 600 candidates so narrowed: 61.1 s on h200, gpt2-xl at 1/8 207.63 ms, ResNet-152
//   at 1/8 42.33, geometric mean 0.05% lower. Pinned search, on the same traces: where the
//   compute of the best plan waits, for at least 5% of its step, on the copies of one value
//   that may not be remade (a gradient copied out and back around the reruns of the ops before
//   its read, say), the whole search runs again with that value never evicted by its sweeps,
//   so every stage plans around it (pinned in the finished plan alone, the sweeps find no room
//   for it), and the faster plan wins (on h200, ResNet-50 at 1/8 of its peak: 68.4 -> 63.8 ms;
//   gpt2-small at 1/4: 22.74 -> 22.35; planning the zoo takes about a quarter longer). Queued
//   search, beside it: a copy waited for may itself be short but queued behind others (a queue
//   serves one copy at a time), so the whole search runs once more with the value kept and also,
//   of the values that may not be remade whose copies ran back to back ahead of its waited
//   copies (copies_ahead in sim_waits.hpp), the largest, until they add up to twice the bytes
//   that queue moves in the wait, and the fastest of the three plans wins
//   (planner_options::auto_queued_search). On h200, gpt2-small at 1/4 of its peak: the loss
//   waited 1.21 ms for a small weight's copy out, queued behind the embedding's two Adam moments
//   (147 MiB each, 6.2 ms of copies out in a forward pass of 5.7 ms of compute); kept, 22.35 ->
//   21.10 ms; gpt2-medium at 1/8 57.45 -> 56.37, gpt2-xl at 1/8 209.95 -> 207.24, bert-large
//   at 1/8 95.75 -> 95.38. Keeping every such value ahead instead gains less (gpt2-small 21.43,
//   the others unchanged), and those covering the wait's bytes once less still (22.34); a
//   second round of both searches from the plan they found, nothing on the zoo; both searches
//   where the waits make up 1% of the step instead of 5%, gpt3-6.7b at 1/8 737.38 -> 721.33 ms,
//   gpt2-large at 1/8 113.51 -> 113.27, bert-large at 1/4 90.04 -> 89.92, the other rows the
//   same, at up to three times the planning time (gpt2-xl at 1/8: 6.9 -> 13.8 s). Held
//   search: where the best plan's compute still waits on copies of transients (activations and
//   their gradients, not model state) for over a quarter of its step, the whole search runs
//   once more with every rerun schedule leaving room, beside each op a rerun is spread to, for
//   the values held over that op that no rerun can make (Note [Rerun schedules],
//   room_for_held), and the faster plan wins (planner_options::auto_room_for_held). The rule is
//   not better everywhere (ResNet-152 at 0.105 of its peak: 44.9 ms without it, 49.5 with it
//   alone), so it is a second search, not the only one. On h200, ResNet-50 at 1/8 of its peak:
//   61.29 -> 58.41 ms: layer1.2's conv2 output is made again from the block input instead of
//   copied in, and the waits for the first two block outputs drop to the 3.97 ms the link needs
//   for one (Note [Memory windows]); at 0.13, 0.14 and 0.175: 53.03 -> 52.33, 47.26 -> 45.43,
//   36.44 -> 35.32; no other zoo row at 1/4 or 1/8 searches again. The candidates of
//   a stage are planned at once on the host's cores and the fastest kept (the first of equals).
//   As every baseline's plan is among them, it is never slower than any baseline. On longer
//   traces, auto's own swap plan and checkpoint's values swept take the shorter sweep search
//   too (a GPT-2 trace of about 10,000 ops at 1/4 of its peak: the same step, about a third less
//   planning time). The device view of a host placement (Note [Host placement]) is searched
//   without the swap-only baselines; the device plan it is weighed against holds them.
// Tried and not kept, all on h200 (`plan --model zoo --hw h200 --budget-ratio 0.25 0.125`), for
// ResNet-50 at 1/8 of its peak (61.3 ms, 4.4x the ideal step): its forward pass waits on copies
// out (95% busy) and its backward pass on copies in (87%). The first stage's three 189 MiB block
// outputs can neither stay nor be remade beside that stage's backward ops, which hold 567 MiB of
// the 689, so they cross the link.
//   - More search: 3,000 stage-4 candidates and 30 stage-3 rounds: 61.29 -> 61.28 ms.
//   - Sweeps whose victims are sized to the bytes missing (each one's score scaled by missing /
//     bytes, eight looked at per heap): 60.0 ms, but other rows up to 0.3% slower and the
//     10,022-op trace planned in 0.71 s instead of 0.52.
//   - A victim's lateness counted against every copy out queued before it, not only model state:
//     gpt2-small at 1/4 22.35 -> 24.40 ms.
//   - The pinned search open to values that may be remade: no row changes (a 189 MiB block output
//     kept for the whole step leaves no plan). The last block output kept on the device only
//     between its two copies in (ops 290-302): 1.53 -> 1.44 GiB copied in, but 61.62 ms. Kept
//     by the trace itself (read by every op from 38 to 300), auto plans 63.55 ms: its gradient
//     (189 MiB, written at op 293, read at 301) crosses the link instead.
//   - By hand, every value dropped but the block outputs, each block's conv1 and relu2 outputs,
//     the stem's pool output and the images, swaps by auto's sweep: 86.6 ms, the forward pass
//     35 ms of copies out beside 6.1 ms of compute (the sweep sends every stage's block outputs
//     out, not only the first stage's).
//   - The optimal reference (bench/plan_optimal.cpp, its 400-op limit raised for this 442-op
//     trace): CBC had given no solution after 40 minutes under a 25-minute limit.
//   - Those block outputs remade early, in the backward pass of the last stages (where an op
//     holds under 100 MiB), and copied out there, where that direction idles. Spread by depth
//     (Note [Rerun schedules]), a block's batch norms, add and ReLU land on one op and hold at
//     least 756 MiB there, so no such plan kept the budget. Placed consumers first, each rerun
//     as late as its readers and the room of the ops allow, the forward pass went from 25.8 to
//     17.9 ms but the backward pass from 35.5 to 61.5 (each chain waits for the copy out of what
//     the chain before made, and every block output still comes back in): 79.4 ms. Spread one
//     op per rerun in list order (so no two of a block's 189 MiB reruns share an op), the three
//     made at ops 195, 205 and 215: forward 14.8 ms, backward 60.4 (the chains read the block
//     internals the plan swaps, so 2.31 GiB come in where 1.53 did), 75.2 ms; stages 3 and 4
//     run from it: 62.1 ms. The link bounds this row either way: each block output crosses it
//     twice, and moving its copy out from the forward pass to the backward one only moves the
//     wait.
//   - Simulated annealing over the values dropped, after stage 4 (one to three values near each
//     other in trace order changed per candidate, eight candidates a round, worse ones taken
//     with a chance that starts at a 2% slower step and falls to none): 4,000 candidates 58.82
//     ms, 24,000 candidates 58.12 ms after 79 s of planning. Which values are dropped is worth
//     about 5%; the rest lies in when the copies run.
//   - Copies in served in order of use (no prefetch issued before one with an earlier use):
//     61.45 ms. Each prefetch moved up to 8 ops earlier or 16 later, kept where faster: 60.46
//     ms, the other rows 0-0.1%, ResNet-152 at 1/8 planned in 12.8 s instead of 5.1.
//   Copied out in the forward pass, those three outputs alone hold the link 11.9 ms (h200's 50
//   GB/s) beside 6.2 ms of forward compute, and come back in over a backward pass of 7.7 ms of
//   compute whose first-stage ops leave no room for them early; the zoo's geometric-mean target
//   asks 19 ms of that row with the other rows as they are. No plan reaches that: layer1.2's
//   input (layer1.1's output, 189 MiB) cannot be on the device at layer1.2.relu3.bwd or
//   layer1.2.bn3.bwd (567 MiB each, ops 302-303), nor be made again before layer1.2.conv1.bwd
//   (op 310) reads it while the 189 MiB gradient op 302 writes (read up to op 310) is there:
//   its add needs 567 MiB beside it. So after op 302 at least 189 MiB cross the link before op
//   310 starts (the input comes in, or that gradient goes out), 3.97 ms beside 0.46 ms of
//   compute; layer1.1 likewise. Every plan takes at least the ideal 13.9 ms plus 7.0 ms, and
//   the lower bound says so (Note [Memory windows] in bound_window.cpp: 20.9 ms).

namespace {

struct judged {
  plan p;
  sim_result sim;
  // What it was made from, for stage 3 (Note [Recomputing planners]): the values it drops (by
  // tensor; empty when none) and the schedule's settings.
  std::vector<char> want;
  bool keep_made = true, spread = true;
  std::vector<char> again;  // values made again even when keep_made (schedule_reruns)
  std::vector<char> stay;   // values auto's sweeps never evict (the pinned search); empty: none
  bool held = false;        // schedule_reruns' room_for_held
};

// Plans `t` dropping and remaking the candidates `want` selects; `swap` plans the folded trace.
// Nothing when the folded trace needs more than the budget at some op.
template <class Swap>
std::optional<judged> with_reruns(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                                  const std::vector<remake_candidate>& cands, const std::vector<char>& want,
                                  const std::string& policy, Swap swap, bool keep_made = true, bool spread = false,
                                  const plan_judge* judge = nullptr, const std::vector<char>& again = {},
                                  bool held = false) {
  const auto s = schedule_reruns(t, r, hw, cands, want, keep_made, spread, again, budget, held);
  if (s.remade == 0) return std::nullopt;
  const auto fr = analyze(s.folded);
  if (fr.min_budget_bytes > budget) return std::nullopt;
  plan p = unfold_plan(swap(s.folded, fr), s, t.tensors.size());
  p.policy = policy;
  auto sim = judge ? (*judge)(p) : simulate(t, r, p, hw);
  return judged{std::move(p), std::move(sim), want, keep_made, spread, again, {}, held};
}

// with_reruns for auto's last stages: auto's sweep search `so` plans the folded trace.
std::optional<judged> with_auto_swaps(const trace& t, const lifetime_report& r, const hw_profile& hw,
                                      std::uint64_t budget, const std::vector<remake_candidate>& cands,
                                      const std::vector<char>& want, const planner_options& so, bool keep_made,
                                      bool spread, const plan_judge* judge, const std::vector<char>& again,
                                      const std::vector<char>& stay, bool held) {
  auto j = with_reruns(
      t, r, hw, budget, cands, want, "auto",
      [&](const trace& ft, const lifetime_report& fr) {
        return auto_swap_plan(ft, fr, hw, budget, so, stay.empty() ? nullptr : &stay);
      },
      keep_made, spread, judge, again, held);
  if (j) j->stay = stay;
  return j;
}

bool better(const sim_result& a, const sim_result& b) {
  return a.feasible() != b.feasible() ? a.feasible() : a.step_seconds < b.step_seconds;
}

void keep_best(std::optional<judged>& best, std::optional<judged> cand) {
  if (cand && (!best || better(cand->sim, best->sim))) best = std::move(cand);
}

// Runs the candidate makers at once (each is independent: its own planners, its own
// simulation) and keeps the best, the earliest of equals, so the result does not depend on
// which finishes first.
std::optional<judged> best_of(std::vector<std::function<std::optional<judged>()>> makers) {
  std::vector<std::optional<judged>> out(makers.size());
  tbb::parallel_for(std::size_t{0}, makers.size(), [&](std::size_t i) { out[i] = makers[i](); });
  std::optional<judged> best;
  for (auto& c : out) keep_best(best, std::move(c));
  return best;
}

// The candidates ordered by bytes freed per second of rerun, most first.
std::vector<std::size_t> by_bytes_per_rerun_second(const trace& t, const std::vector<remake_candidate>& c) {
  std::vector<std::size_t> order(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) order[i] = i;
  auto score = [&](std::size_t i) {
    return static_cast<double>(t.tensors[c[i].x].bytes) / std::max(c[i].rerun_seconds, 1e-12);
  };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return score(a) > score(b); });
  return order;
}

}  // namespace

std::vector<std::size_t> single_reruns(const trace& t, const lifetime_report& r, const std::vector<remake_candidate>& c,
                                       const std::vector<std::size_t>& order) {
  std::vector<char> taken(t.tensors.size(), 0), read_by_taken(t.tensors.size(), 0);
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& k = c[order[i]];
    const auto& reads = t.ops[k.writer].reads;
    // Each input must still be there when the value is made again: not dropped itself, and
    // alive until then (a value dead since its last use would need its own writer rerun).
    auto there = [&](tensor_id x) {
      return !taken[x] && (is_persistent(t.tensors[x].kind) || (r.tensors[x].used() && r.tensors[x].last_use() >= k.use));
    };
    if (read_by_taken[k.x] || !std::all_of(reads.begin(), reads.end(), there)) continue;
    taken[k.x] = 1;
    for (tensor_id x : reads) read_by_taken[x] = 1;
    out.push_back(i);
  }
  return out;
}

namespace {

// `order` with the single reruns first (each group keeping its order), so a share of it drops
// values whose reruns stand alone before it starts chains.
std::vector<std::size_t> single_reruns_first(const trace& t, const lifetime_report& r, const std::vector<remake_candidate>& c,
                                             const std::vector<std::size_t>& order) {
  const auto single = single_reruns(t, r, c, order);
  std::vector<char> first(order.size(), 0);
  std::vector<std::size_t> out;
  for (auto i : single) {
    first[i] = 1;
    out.push_back(order[i]);
  }
  for (std::size_t i = 0; i < order.size(); ++i)
    if (!first[i]) out.push_back(order[i]);
  return out;
}

std::vector<char> first_share(std::size_t tensors, const std::vector<remake_candidate>& c,
                              const std::vector<std::size_t>& order, double share) {
  std::vector<char> want(tensors, 0);
  const auto take = static_cast<std::size_t>(std::ceil(share * static_cast<double>(order.size())));
  for (std::size_t i = 0; i < std::min(take, order.size()); ++i) want[c[order[i]].x] = 1;
  return want;
}

// A shorter sweep search for the folded traces of auto and capuchin.
planner_options short_search(const planner_options& o) {
  planner_options s = o;
  s.auto_sweep_reserves = {0.0, 0.15};
  s.auto_late_weights = {0.0, 4.0};
  s.auto_keep_shares = {0.5, 1.0};
  return s;
}

// A narrower one still for stage 4's candidates (Note [Recomputing planners]): one sweep reserve,
// the late weights 0 and 4, every value kept over the boundary, no late prefetches or homing.
planner_options toggle_search(const planner_options& short_one) {
  planner_options s = short_one;
  s.auto_sweep_reserves = {0.0};
  s.auto_late_weights = {0.0, 4.0};
  s.auto_keep_shares = {1.0};
  s.auto_prefetch_leads = {};
  s.auto_home_state = false;
  return s;
}

// checkpoint's choice (Note [Recomputing planners]): every candidate but the values that cross
// a layer boundary; with `group` > 1, only the boundaries between groups of that many layers
// (fewer values kept, longer reruns).
std::vector<char> checkpoint_set(const trace& t, const lifetime_report& r, const std::vector<remake_candidate>& cands,
                                 std::int64_t group = 1, std::size_t run_of = 0, bool ignore_layers = false) {
  // Layer of each op: its own, or runs of about sqrt(n) recomputable ops (`run_of` when given)
  // where it has none.
  std::size_t recomputable = 0;
  for (const auto& o : t.ops) recomputable += o.recomputable;
  const auto run = run_of ? run_of
                          : std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(recomputable)))));
  std::vector<std::int64_t> layer(t.ops.size(), -1);
  std::size_t seen = 0;
  for (op_index k = 0; k < t.ops.size(); ++k) {
    const auto& o = t.ops[k];
    if (o.layer >= 0 && !ignore_layers) layer[k] = o.layer / group;
    else if (o.recomputable) layer[k] = -2 - static_cast<std::int64_t>(seen / run) / group;
    seen += o.recomputable;
  }
  std::vector<char> want(t.tensors.size(), 0);
  for (const auto& c : cands) {
    bool boundary = false;
    for (const auto& u : r.tensors[c.x].uses)
      if (u.reads && t.ops[u.op].recomputable && layer[u.op] != layer[c.writer]) boundary = true;
    want[c.x] = !boundary;
  }
  return want;
}

std::optional<judged> checkpoint_plan(const trace& t, const lifetime_report& r, const hw_profile& hw,
                                      std::uint64_t budget, const planner_options& opt) {
  const auto cands = remake_candidates(t, r, hw);
  auto lms = make_planner("lms", opt);
  return with_reruns(t, r, hw, budget, cands, checkpoint_set(t, r, cands), "checkpoint",
                     [&](const trace& f, const lifetime_report& fr) { return lms->make_plan(f, fr, hw, budget); });
}

std::optional<judged> capuchin_plan(const trace& t, const lifetime_report& r, const hw_profile& hw,
                                    std::uint64_t budget, const planner_options& opt) {
  // Swaps are taken in the order their values go idle, each on a link already busy with the
  // ones before it; a swap hides when its copy out and back end before the value's next use.
  // The model state that does not fit crosses the link too, at least least_transfers' floor for
  // persistent tensors each way, spread here over the step; the swaps get what is left.
  auto all = remake_candidates(t, r, hw);
  std::sort(all.begin(), all.end(), [](const remake_candidate& a, const remake_candidate& b) { return a.after < b.after; });
  std::vector<double> at(t.ops.size() + 1, 0);
  for (std::size_t k = 0; k < t.ops.size(); ++k) at[k + 1] = at[k] + hw.op_seconds(t.ops[k]);
  const auto state = least_transfers(t, r, budget, hw.host_bytes, {.persistent_only = true});
  auto left = [&](double bytes_per_s, std::uint64_t state_bytes) {  // 0: no swap hides
    return at.back() > 0 ? std::max(0.0, bytes_per_s - static_cast<double>(state_bytes) / at.back()) : bytes_per_s;
  };
  const double d2h_rate = left(hw.d2h_bytes_per_s, state.d2h_bytes);
  const double h2d_rate = left(hw.h2d_bytes_per_s, state.h2d_bytes);
  const bool room = d2h_rate > 0 && h2d_rate > 0;
  double d2h_free = 0, h2d_busy = 0;
  std::vector<remake_candidate> cands;
  for (const auto& c : all) {
    const double b = static_cast<double>(t.tensors[c.x].bytes);
    const double out_end = room ? std::max(at[c.after + 1], d2h_free) + b / d2h_rate : 0;
    const double in_time = room ? b / h2d_rate : 0;
    if (room && out_end + in_time <= at[c.use] && h2d_busy + in_time <= at[c.use]) {
      d2h_free = out_end;
      h2d_busy += in_time;
    } else {
      cands.push_back(c);  // the swap would not hide: remake it
    }
  }
  const auto order = by_bytes_per_rerun_second(t, cands);
  const auto so = short_search(opt);
  std::vector<std::function<std::optional<judged>()>> makers;
  for (double share : {0.5, 1.0})
    makers.push_back([&, share] {
      return with_reruns(t, r, hw, budget, cands, first_share(t.tensors.size(), cands, order, share), "capuchin",
                         [&](const trace& f, const lifetime_report& fr) { return auto_swap_plan(f, fr, hw, budget, so); });
    });
  return best_of(std::move(makers));
}

// The plan another planner makes, judged, under the name `policy`.
judged judge_planner(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                     const planner& swapper, const std::string& policy, const plan_judge* judge = nullptr) {
  plan p = swapper.make_plan(t, r, hw, budget);
  p.policy = policy;
  auto sim = judge ? (*judge)(p) : simulate(t, r, p, hw);
  return {std::move(p), std::move(sim), {}, true, true, {}, {}};
}

class checkpoint_planner final : public optioned_planner {
 public:
  explicit checkpoint_planner(const planner_options& o) : optioned_planner("checkpoint", o) {}

 private:
  plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) const override {
    // Where its reruns leave no plan that keeps the budget, lms's swaps alone (if they do).
    auto best = checkpoint_plan(t, r, hw, budget, options());
    if (!best || !best->sim.feasible())
      keep_best(best, judge_planner(t, r, hw, budget, *make_planner("lms", options()), "checkpoint"));
    return std::move(best->p);
  }
};

class capuchin_planner final : public optioned_planner {
 public:
  explicit capuchin_planner(const planner_options& o) : optioned_planner("capuchin", o) {}

 private:
  plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget) const override {
    // Capuchin swaps first and remakes only where a swap would not hide: with nothing to remake
    // or no remake that fits, its plan is the swap-only one.
    auto best = capuchin_plan(t, r, hw, budget, options());
    if (!best || !best->sim.feasible()) {
      auto so = options();
      so.auto_recompute = false;
      keep_best(best, judge_planner(t, r, hw, budget, *make_planner("auto", short_search(so)), "capuchin"));
    }
    return std::move(best->p);
  }
};

// Stage 3 (Note [Recomputing planners]): the copies the best plan's compute waits for, made
// reruns instead where their values may be remade. Per round, the values behind each of the
// three longest waits not tried yet, and all of them together, each added to the values the
// plan drops, with its schedule's settings, with the other keep_made, and with the other
// spread (a chain spread over the ops before the one it serves puts each value beside an op's
// own; held whole, a temp goes before the op's outputs: Note [Rerun temps before the op]).
void stalls_to_reruns(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                      const std::vector<remake_candidate>& all, const planner_options& opt,
                      std::optional<judged>& best, const plan_judge* judge) {
  constexpr std::size_t waits_per_round = 3;
  const std::size_t nt = t.tensors.size();
  std::vector<char> may(nt, 0), tried(nt, 0);
  for (const auto& c : all) may[c.x] = 1;
  const auto order = by_bytes_per_rerun_second(t, all);
  const auto so = short_search(opt);
  bool changed = true;
  std::vector<compute_wait> waits;
  for (std::uint32_t round = 0; round < opt.auto_stall_rounds; ++round) {
    if (changed) {
      sim_options rec;
      rec.record_timeline = true;
      waits = waited_copies(simulate(t, r, best->p, hw, rec), 0.01 * best->sim.step_seconds);
    }
    const auto base = best->want.empty() ? std::vector<char>(nt, 0) : best->want;
    const auto base_again = best->again.empty() ? std::vector<char>(nt, 0) : best->again;
    // A value the plan drops yet copies was made early by a chain and kept: it is made again
    // before its own read instead.
    auto addable = [&](tensor_id x) { return base[x] ? !base_again[x] : may[x] == 1; };
    std::vector<std::vector<tensor_id>> picks;
    for (const auto& w : waits) {
      std::vector<tensor_id> add;
      for (tensor_id x : w.copies)
        if (addable(x) && !tried[x] && std::find(add.begin(), add.end(), x) == add.end()) add.push_back(x);
      if (add.empty() && !w.rerun) {
        // No value behind the wait may be remade (model state, say): the op waited for the
        // memory a copy out frees, so values that may be remade and live over it are dropped
        // instead, as many bytes as the copies move, most bytes per rerun second first.
        std::uint64_t need = 0, got = 0;
        for (tensor_id x : w.copies) need += t.tensors[x].bytes;
        for (std::size_t i : order) {
          if (got >= need) break;
          if (all[i].after < w.op && w.op < all[i].use && !base[all[i].x] && !tried[all[i].x]) {
            add.push_back(all[i].x);
            got += t.tensors[all[i].x].bytes;
          }
        }
      }
      if (add.empty()) continue;
      for (tensor_id x : add) tried[x] = 1;
      picks.push_back(std::move(add));
      if (picks.size() == waits_per_round) break;
    }
    if (picks.empty()) return;
    if (picks.size() > 1) {
      std::vector<tensor_id> every;
      for (const auto& p : picks) every.insert(every.end(), p.begin(), p.end());
      picks.push_back(std::move(every));
    }
    std::vector<std::function<std::optional<judged>()>> makers;
    for (const auto& p : picks)
      for (int setting = 0; setting < 3; ++setting)
        makers.push_back([&, p, keep_made = setting == 1 ? !best->keep_made : best->keep_made,
                          spread = setting == 2 ? !best->spread : best->spread, stay = best->stay,
                          held = best->held] {
          auto want = base, again = base_again;
          for (tensor_id x : p) (base[x] ? again : want)[x] = 1;
          return with_auto_swaps(t, r, hw, budget, all, want, so, keep_made, spread, judge, again, stay, held);
        });
    auto cand = best_of(std::move(makers));
    changed = cand && better(cand->sim, best->sim);
    if (changed) best = std::move(cand);
  }
}

// Stage 3's last step (Note [Recomputing planners]): the best plan keeps, swapping it where it
// must, each of these shares of the values it drops, those that free the fewest bytes per
// second of rerun first.
void keep_least_worth(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                      const std::vector<remake_candidate>& all, const planner_options& so, std::optional<judged>& best,
                      const plan_judge* judge) {
  if (best->want.empty()) return;
  std::vector<std::size_t> dropped;  // most bytes per rerun second first
  for (auto i : by_bytes_per_rerun_second(t, all))
    if (best->want[all[i].x]) dropped.push_back(i);
  std::vector<std::function<std::optional<judged>()>> makers;
  for (double share : {0.05, 0.1, 0.2, 0.3}) {
    auto want = best->want;
    const auto n = static_cast<std::size_t>(share * static_cast<double>(dropped.size()));
    if (n == 0) continue;
    for (std::size_t j = 0; j < n; ++j) want[all[dropped[dropped.size() - 1 - j]].x] = 0;
    makers.push_back([&, want, keep_made = best->keep_made, spread = best->spread, again = best->again,
                      stay = best->stay, held = best->held] {
      return with_auto_swaps(t, r, hw, budget, all, want, so, keep_made, spread, judge, again, stay, held);
    });
  }
  keep_best(best, best_of(std::move(makers)));
}

// Stage 4 (Note [Recomputing planners]): single changes to the best plan's dropped values,
// one value dropped or kept each, in trace order, a batch at a time; the best of a batch that
// is faster than the plan becomes the plan, and later batches change it. It ends after
// `evaluations` candidates, or once a whole round of the values has changed nothing. The
// candidates take toggle_search's swaps, and so does the plan they are weighed against; the
// values the last one drops get `so`'s swaps once more at the end, and the fastest of the three
// plans (the stage's first, its last, and that) is kept.
void toggle_reruns(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                   const std::vector<remake_candidate>& all, const planner_options& so, std::size_t evaluations,
                   std::optional<judged>& best, const plan_judge* judge) {
  // A fixed batch, not one per core, so the plan is the same on every machine.
  constexpr std::size_t batch = 8;
  const std::size_t nt = t.tensors.size();
  if (all.empty() || evaluations == 0) return;
  const auto ts = toggle_search(so);
  auto replan = [&](const judged& j, const planner_options& o) {
    return with_auto_swaps(t, r, hw, budget, all, j.want, o, j.keep_made, j.spread, judge, j.again, j.stay, j.held);
  };
  std::optional<judged> cur = best->want.empty() ? std::nullopt : replan(*best, ts);
  if (!cur) cur = best;
  std::size_t done = 0, next = 0, unchanged = 0, changes = 0;
  while (done < evaluations && unchanged < all.size()) {
    const auto base = cur->want.empty() ? std::vector<char>(nt, 0) : cur->want;
    std::vector<std::function<std::optional<judged>()>> makers;
    for (std::size_t j = 0; j < std::min(batch, all.size()); ++j)
      makers.push_back([&, x = all[(next + j) % all.size()].x, keep_made = cur->keep_made, spread = cur->spread,
                        again = cur->again, stay = cur->stay, held = cur->held] {
        auto want = base;
        want[x] = !want[x];
        return with_auto_swaps(t, r, hw, budget, all, want, ts, keep_made, spread, judge, again, stay, held);
      });
    next = (next + makers.size()) % all.size();
    done += makers.size();
    unchanged += makers.size();
    auto cand = best_of(std::move(makers));
    if (cand && better(cand->sim, cur->sim)) {
      cur = std::move(cand);
      unchanged = 0;
      ++changes;
    }
  }
  if (changes > 0) keep_best(best, replan(*cur, so));
  keep_best(best, std::move(cur));
}

// auto's search (Note [Recomputing planners]), its sweeps never evicting the values of `stay`
// (indexed by tensor; empty: none); the baselines' plans only without such values.
std::optional<judged> recompute_search(const trace& t, const lifetime_report& r, const hw_profile& hw,
                                       std::uint64_t budget, const planner_options& opt, const plan_judge* judge,
                                       const std::vector<char>& stay, bool held = false) {
  auto swap_opt = opt;
  swap_opt.auto_recompute = false;
  const bool fine = t.ops.size() <= opt.auto_fine_search_ops;
  const auto so = short_search(swap_opt);
  const auto* pins = stay.empty() ? nullptr : &stay;
  std::vector<std::function<std::optional<judged>()>> makers;
  makers.push_back([&]() -> std::optional<judged> {
    plan own = auto_swap_plan(t, r, hw, budget, fine ? swap_opt : so, pins);
    auto sim = judge ? (*judge)(own) : simulate(t, r, own, hw);
    return judged{std::move(own), std::move(sim), {}, true, true, {}, stay};
  });
  // Every baseline's plan is a candidate, so auto is never slower than one of them. A device
  // view of a host placement (`judge` given) leaves out the swap-only ones: the device plan
  // it is weighed against has them (over the zoo, no auto row changes without them).
  for (const char* name : {"lms", "vdnn-all", "vdnn-conv", "checkpoint", "capuchin"}) {
    const bool swap_only = std::string_view(name) != "checkpoint" && std::string_view(name) != "capuchin";
    if ((judge && swap_only) || pins) continue;
    makers.push_back([&, name]() -> std::optional<judged> {
      return judge_planner(t, r, hw, budget, *make_planner(name, swap_opt), "auto", judge);
    });
  }
  // checkpoint's values with auto's sweep, and the share of them that frees the most bytes
  // per rerun second; then, when the best plan still stalls, the values within groups of 2 and
  // 4 layers (fewer kept, longer reruns), for budgets that cannot hold a value per layer.
  const auto all = remake_candidates(t, r, hw);
  struct family {
    std::vector<remake_candidate> cands;
    std::vector<std::size_t> order;
  };
  std::vector<family> fams;
  const bool layered = std::any_of(t.ops.begin(), t.ops.end(), [](const op_desc& o) { return o.recomputable && o.layer >= 0; });
  for (std::int64_t group : {1, 2, 4, 0}) {
    // group 0: every second recomputable op starts a run of its own, whatever layers the trace
    // names (short reruns, for budgets just above the least, where a whole layer's values do not
    // fit at once while it is made again).
    const auto in_set = group ? checkpoint_set(t, r, all, group) : checkpoint_set(t, r, all, 1, 2, layered);
    family f;
    for (const auto& c : all)
      if (in_set[c.x]) f.cands.push_back(c);
    f.order = by_bytes_per_rerun_second(t, f.cands);
    fams.push_back(std::move(f));
  }
  // checkpoint's values with the reruns that need no other rerun first (family 4), so its
  // smaller shares drop values whose reruns stand alone before they start chains.
  fams.push_back({fams[0].cands, single_reruns_first(t, r, fams[0].cands, fams[0].order)});
  // Of every candidate, the single reruns alone (family 5): for budgets so near the least that
  // a chain's values do not fit beside the op they serve.
  {
    family f;
    const auto order = by_bytes_per_rerun_second(t, all);
    for (auto i : single_reruns(t, r, all, order)) f.cands.push_back(all[order[i]]);
    f.order = by_bytes_per_rerun_second(t, f.cands);
    fams.push_back(std::move(f));
  }
  auto add = [&](std::size_t i, double share, bool keep_made, bool spread = true) {
    makers.push_back([&, i, share, keep_made, spread] {
      const auto& f = fams[i];
      return with_reruns(
          t, r, hw, budget, f.cands, first_share(t.tensors.size(), f.cands, f.order, share), "auto",
          [&](const trace& ft, const lifetime_report& fr) {
            return auto_swap_plan(ft, fr, hw, budget, fine && share >= 1 && i == 0 && keep_made ? swap_opt : so, pins);
          },
          keep_made, spread, judge, {}, held);
    });
  };
  add(0, 1.0, true);
  auto best = best_of(std::move(makers));
  const double stall = best->sim.stall_seconds, rerun = best->sim.recompute_seconds, step = best->sim.step_seconds;
  if (stall + rerun > 0.05 * step) {
    // Stage 2: smaller shares of checkpoint's values, the single reruns first among them
    // (fewer reruns where memory is left); where the plan still stalls, shares in plain
    // bytes-per-second order, the other families and every single rerun too.
    makers.clear();
    for (double share : {0.5, 0.75}) add(4, share, true);
    if (fine)
      for (double share : {0.9, 0.95}) add(4, share, true);
    if (stall > 0.05 * step) {
      for (double share : opt.auto_remake_shares)
        if (share < 1) add(0, share, true);
      add(0, 1.0, false);
      add(0, 1.0, true, false);
      for (std::size_t i = 1; i < 4; ++i)
        for (bool keep_made : {true, false}) add(i, 1.0, keep_made);
      add(5, 1.0, true);
    }
    keep_best(best, best_of(std::move(makers)));
  }
  if (!best) return best;
  best->stay = stay;
  if (fine) stalls_to_reruns(t, r, hw, budget, all, swap_opt, best, judge);
  if (fine && opt.auto_stall_rounds > 0) keep_least_worth(t, r, hw, budget, all, so, best, judge);
  if (fine) toggle_reruns(t, r, hw, budget, all, so, opt.auto_toggle_evaluations, best, judge);
  return best;
}

// The best plan's timeline and the waits of its compute, each with the copies behind it.
struct timed_waits {
  sim_result sim;
  std::vector<compute_wait> waits;
};
timed_waits waits_of(const trace& t, const lifetime_report& r, const hw_profile& hw, const judged& best) {
  sim_options rec;
  rec.record_timeline = true;
  timed_waits out{simulate(t, r, best.p, hw, rec), {}};
  out.waits = waited_copies(out.sim, 0);
  return out;
}

// The values that may not be remade, by tensor.
std::vector<char> fixed_values(const trace& t, const lifetime_report& r, const hw_profile& hw) {
  std::vector<char> fixed(t.tensors.size(), 1);
  for (const auto& c : remake_candidates(t, r, hw)) fixed[c.x] = 0;
  return fixed;
}

// Of `w.waits`, the value waited for longest, in all, of those that may not be remade (`fixed`),
// where those waits make up at least `share` of the step (Note [Recomputing planners], the
// pinned search); empty when there is none.
std::vector<char> most_waited_value(const std::vector<char>& fixed, const timed_waits& w, double share) {
  std::vector<double> waited(fixed.size(), 0);
  for (const auto& c : w.waits)
    for (tensor_id x : c.copies)
      if (x < waited.size() && fixed[x]) waited[x] += c.seconds;
  const auto most = std::max_element(waited.begin(), waited.end());
  if (most == waited.end() || *most < share * w.sim.step_seconds) return {};
  std::vector<char> out(fixed.size(), 0);
  out[static_cast<std::size_t>(most - waited.begin())] = 1;
  return out;
}

// `stay` (one value) and the values that held up its copies (the queued search): for each wait
// on a copy of it, of the values that may not be remade whose copies ran back to back ahead of
// that copy on its queue, the largest first, until they add up to twice the bytes that queue
// moves in the wait.
std::vector<char> with_values_queued_ahead(const trace& t, const hw_profile& hw, const std::vector<char>& fixed,
                                           const timed_waits& w, std::vector<char> stay) {
  const auto v = static_cast<tensor_id>(std::find(stay.begin(), stay.end(), 1) - stay.begin());
  for (const auto& c : w.waits)
    for (std::size_t i = 0; i < c.copies.size(); ++i) {
      if (c.copies[i] != v) continue;
      std::vector<tensor_id> ahead;
      for (tensor_id x : copies_ahead(w.sim, c, i))
        if (x < stay.size() && fixed[x]) ahead.push_back(x);
      std::stable_sort(ahead.begin(), ahead.end(),
                       [&](tensor_id a, tensor_id b) { return t.tensors[a].bytes > t.tensors[b].bytes; });
      const double need = 2 * c.seconds * copy_bytes_per_second(hw, c.tracks[i]);
      double held = 0;
      for (tensor_id x : ahead) {
        if (held >= need) break;
        stay[x] = 1;
        held += static_cast<double>(t.tensors[x].bytes);
      }
    }
  return stay;
}

// Of `waits`, the seconds spent on copies of transients (activations, their gradients), not of
// model state: the waits a schedule of reruns may shorten.
double transient_wait_seconds(const trace& t, const timed_waits& tw) {
  double sum = 0;
  for (const auto& w : tw.waits)
    if (std::any_of(w.copies.begin(), w.copies.end(), [&](tensor_id x) { return x < t.tensors.size() && !is_persistent(t.tensors[x].kind); }))
      sum += w.seconds;
  return sum;
}

}  // namespace

plan auto_recompute_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                         const planner_options& opt, const plan_judge* judge) {
  if (r.peak_live_bytes <= budget) {  // everything fits
    auto swap_opt = opt;
    swap_opt.auto_recompute = false;
    return auto_swap_plan(t, r, hw, budget, swap_opt);
  }
  auto best = recompute_search(t, r, hw, budget, opt, judge, {});
  if (t.ops.size() <= opt.auto_fine_search_ops && opt.auto_stall_rounds > 0) {
    auto waits = waits_of(t, r, hw, *best);
    const auto fixed = fixed_values(t, r, hw);
    const auto stay = most_waited_value(fixed, waits, 0.05);
    if (!stay.empty()) {
      // The pinned search, then the queued one where copies held up the waited value's.
      auto pinned = recompute_search(t, r, hw, budget, opt, judge, stay);
      const auto queue = opt.auto_queued_search ? with_values_queued_ahead(t, hw, fixed, waits, stay) : stay;
      if (queue != stay) keep_best(pinned, recompute_search(t, r, hw, budget, opt, judge, queue));
      if (pinned && better(pinned->sim, best->sim)) {
        best = std::move(pinned);
        waits = waits_of(t, r, hw, *best);
      }
    }
    if (opt.auto_room_for_held && transient_wait_seconds(t, waits) > 0.25 * best->sim.step_seconds)
      keep_best(best, recompute_search(t, r, hw, budget, opt, judge, {}, true));
  }
  best->p.policy = "auto";
  return std::move(best->p);
}

std::unique_ptr<planner> make_checkpoint_planner(const planner_options& opt) {
  return std::make_unique<checkpoint_planner>(opt);
}
std::unique_ptr<planner> make_capuchin_planner(const planner_options& opt) { return std::make_unique<capuchin_planner>(opt); }

}  // namespace spillway::offload::detail
