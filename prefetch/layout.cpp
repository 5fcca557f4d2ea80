// Packs one iteration's device allocations (Note [Layout] in layout.hpp).
#include "prefetch/layout.hpp"

#include <algorithm>
#include <limits>
#include <array>
#include <cstdint>
#include <iterator>
#include <queue>
#include <random>
#include <tuple>

#include "allocator/device_budget.hpp"
#include "prefetch/recompute.hpp"

namespace spillway {
namespace {

struct block {
  tensor_id id = 0;
  std::size_t bytes = 0;
  std::array<std::pair<std::uint32_t, std::uint32_t>, 2> spans{};  // [from, to) slots
  int span_count = 1;
  std::array<std::uint32_t, 2> keys{};  // slots whose allocation of `id` this block serves
  int key_count = 1;
  std::size_t offset = 0;
  std::array<std::pair<double, double>, 2> times{};  // [from, to) device time, when timed
  int time_count = 0;
  std::size_t breadth = 0;  // most bytes alive at one slot of its life

  [[nodiscard]] std::uint64_t duration() const {
    std::uint64_t d = 0;
    for (int i = 0; i < span_count; ++i) d += spans[i].second - spans[i].first;
    return d;
  }
  // Alive together in the executor's order (the host's view of the arena), or, when timed, on
  // the device.
  [[nodiscard]] bool overlaps_in_time(const block& o) const {
    for (int i = 0; i < span_count; ++i)
      for (int j = 0; j < o.span_count; ++j)
        if (spans[i].first < o.spans[j].second && o.spans[j].first < spans[i].second) return true;
    for (int i = 0; i < time_count; ++i)
      for (int j = 0; j < o.time_count; ++j)
        if (times[i].first < o.times[j].second && o.times[j].first < times[i].second) return true;
    return false;
  }
};

std::uint64_t key_of(tensor_id id, std::uint32_t slot) { return (static_cast<std::uint64_t>(id) << 32) | slot; }

// Which blocks the executor allocates following `p`, mirroring its rules: prefetches before the
// op, the op's own tensors, evictions and releases after it, the boundary at both ends.
class residency {
 public:
  residency(const trace& t, const plan& p, std::span<const std::int64_t> release_after, const plan_timing* timing)
      : t_(t), p_(p), timing_(timing), open_(t.tensors.size(), -1), tier_current_(t.tensors.size(), 0),
        released_(t.tensors.size(), 0), releases_(t.ops.size()), uses_(t.tensors.size()), reruns_(t, p) {
    for (op_index k = 0; k < t.ops.size(); ++k) {
      for (auto x : t.ops[k].reads) uses_[x].push_back({k, true});
      for (auto x : t.ops[k].writes) uses_[x].push_back({k, false});
    }
    for (tensor_id x = 0; x < t.tensors.size(); ++x) {
      auto& u = uses_[x];
      std::sort(u.begin(), u.end(), [](auto a, auto b) { return a.first < b.first || (a.first == b.first && a.second && !b.second); });
      if (is_persistent(t.tensors[x].kind)) continue;
      std::int64_t at = u.empty() ? -1 : static_cast<std::int64_t>(u.back().first);
      if (x < release_after.size() && release_after[x] >= 0) at = release_after[x];
      if (at >= 0 && static_cast<std::size_t>(at) < t.ops.size()) releases_[static_cast<std::size_t>(at)].push_back(x);
    }
  }

  std::vector<block> run() {
    const auto n = static_cast<op_index>(t_.ops.size());
    const std::uint32_t end = layout_slot::end(n);
    std::vector<std::int64_t> start_block(t_.tensors.size(), -1);  // persistents resident at the start
    for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
      if (!is_persistent(t_.tensors[x].kind) || x >= p_.initial_tier.size() || p_.initial_tier[x] != tier::device) continue;
      open(x, 0, layout_slot::start_fetch, 0.0);
      start_block[x] = open_[x];
      tier_current_[x] = 1;
    }
    std::vector<tensor_id> temps;  // released values reruns made, still placed
    double device_done = 0;        // when the device ops so far have ended
    for (op_index k = 0; k < n; ++k) {
      const auto& op = t_.ops[k];
      if (k < p_.steps.size())
        for (const auto& pf : p_.steps[k].prefetches)
          if (pf.tensor < open_.size() && open_[pf.tensor] < 0 && !released_[pf.tensor])
            open(pf.tensor, layout_slot::prefetch(k), layout_slot::prefetch(k), time_of(timing_ ? &timing_->load_start : nullptr, pf.tensor, k, op_start(k)));
      // Recomputations (Note [Recomputation] in plan.hpp): their tensors are placed before the op's
      // own, at their slot; an output the program released already lives until the reruns have
      // run where the op does not touch it and no later rerun reads it (Note [Rerun temps before
      // the op]), else until the op ends, or until a later step's rerun that reads it has run
      // (Note [Rerun temps across steps]).
      if (k < p_.steps.size() && !p_.steps[k].recomputes.empty()) {
        for (auto o : p_.steps[k].recomputes) {
          if (o >= n) continue;
          const double at = k == 0 ? 0.0 : op_end(k - 1);
          for (auto x : t_.ops[o].reads)
            if (open_[x] < 0) open(x, layout_slot::rerun(k), layout_slot::rerun(k), at);
          for (auto x : t_.ops[o].writes) {
            if (open_[x] >= 0) continue;
            open(x, layout_slot::rerun(k), layout_slot::rerun(k), at);
            if (released_[x]) temps.push_back(x);
          }
        }
        std::erase_if(temps, [&](tensor_id x) {
          if (open_[x] < 0 || !reruns_.freed_before_op(x, k)) return false;
          close(x, layout_slot::place(k), op_start(k));
          return true;
        });
      }
      if (k < p_.steps.size() && p_.steps[k].on_host) {
        // An op on the host (Note [Host ops in the executor]) places nothing on the device; the
        // device copies of what it writes are dropped before it runs, freed once the device work
        // enqueued before it is done, and the host tier holds the new values.
        for (auto x : op.writes) {
          if (open_[x] >= 0) close(x, layout_slot::place(k), std::max(op_start(k), device_done));
          tier_current_[x] = 1;
        }
      } else {
        device_done = std::max(device_done, op_end(k));
        for (auto x : op.reads)
          if (open_[x] < 0) open(x, layout_slot::place(k), layout_slot::place(k), op_start(k));
        for (auto x : op.writes)
          if (open_[x] < 0) open(x, layout_slot::place(k), layout_slot::place(k), op_start(k));
        for (auto x : op.writes) tier_current_[x] = 0;
      }
      if (k < p_.steps.size()) {
        for (const auto& e : p_.steps[k].evictions) {
          const auto x = e.tensor;
          if (x >= open_.size() || open_[x] < 0) continue;
          if (e.action == evict_action::drop && !is_persistent(t_.tensors[x].kind) && !tier_current_[x] &&
              !reruns_.drop_awaits_rerun(x, k))
            continue;  // the executor keeps a transient until release() (Note [Transients live until release])
          const double freed = e.action == evict_action::drop ? op_end(k) : time_of(timing_ ? &timing_->save_end : nullptr, x, k, op_end(k));
          if (e.action != evict_action::drop) tier_current_[x] = 1;
          close(x, layout_slot::after(k), freed);
        }
      }
      for (auto x : releases_[k]) {
        released_[x] = 1;
        if (open_[x] >= 0) close(x, layout_slot::after(k), op_end(k));
      }
      std::vector<tensor_id> kept;
      for (auto x : temps) {
        if (open_[x] < 0) continue;
        if (k + 1 < n && reruns_.next_rerun_read(x, k) != std::numeric_limits<op_index>::max())
          kept.push_back(x);
        else
          close(x, layout_slot::after(k), op_end(k));
      }
      temps = std::move(kept);
    }
    for (tensor_id x = 0; x < t_.tensors.size(); ++x) {
      if (open_[x] < 0) continue;
      const bool stays = is_persistent(t_.tensors[x].kind) && x < p_.initial_tier.size() && p_.initial_tier[x] == tier::device;
      if (!stays || start_block[x] < 0) {
        close(x, end, step());
        continue;
      }
      auto& last = blocks_[static_cast<std::size_t>(open_[x])];
      if (open_[x] == start_block[x]) {  // resident all through: one block around the whole timeline
        last.spans[0] = {0, end};
        last.times[0] = {0.0, step()};
        continue;
      }
      // Resident at both ends: the block allocated last stays into the next iteration, where it
      // is the block the iteration starts with. One block, wrapping, serving both slots.
      auto& first = blocks_[static_cast<std::size_t>(start_block[x])];
      last.spans[0].second = end;
      last.spans[1] = {0, first.spans[0].second};
      last.span_count = 2;
      if (timing_ != nullptr) {
        last.times[0].second = step();
        last.times[1] = {0.0, first.times[0].second};
        last.time_count = 2;
      }
      last.keys[1] = layout_slot::start_fetch;
      last.key_count = 2;
      first.bytes = 0;  // merged away
      open_[x] = -1;
    }
    std::erase_if(blocks_, [](const block& b) { return b.bytes == 0; });
    return std::move(blocks_);
  }

 private:
  void open(tensor_id x, std::uint32_t from, std::uint32_t key, double at) {
    block b;
    b.id = x;
    b.bytes = device_budget::placed(t_.tensors[x].bytes);
    b.spans[0] = {from, from};
    b.keys[0] = key;
    if (timing_ != nullptr) {
      b.times[0] = {at, at};
      b.time_count = 1;
    }
    open_[x] = static_cast<std::int64_t>(blocks_.size());
    blocks_.push_back(b);
  }
  void close(tensor_id x, std::uint32_t slot, double at) {
    auto& b = blocks_[static_cast<std::size_t>(open_[x])];
    b.spans[0].second = slot;
    b.times[0].second = std::max(b.times[0].first, at);
    open_[x] = -1;
  }
  [[nodiscard]] double op_start(op_index k) const {
    return timing_ != nullptr && k < timing_->op_start.size() ? timing_->op_start[k] : 0.0;
  }
  [[nodiscard]] double op_end(op_index k) const {
    return timing_ != nullptr && k < timing_->op_end.size() ? timing_->op_end[k] : 0.0;
  }
  [[nodiscard]] double step() const { return timing_ != nullptr ? timing_->step : 0.0; }
  static double time_of(const std::unordered_map<std::uint64_t, double>* m, tensor_id x, op_index k, double otherwise) {
    if (m == nullptr) return otherwise;
    auto it = m->find(plan_timing::key(x, k));
    return it == m->end() ? otherwise : it->second;
  }

  const trace& t_;
  const plan& p_;
  const plan_timing* timing_;
  std::vector<std::int64_t> open_;  // index of x's open block, -1 when not resident
  std::vector<char> tier_current_, released_;
  std::vector<std::vector<tensor_id>> releases_;  // per op: transients released after it
  std::vector<std::vector<std::pair<op_index, bool>>> uses_;  // (op, reads) in op order, reads first
  std::vector<block> blocks_;
  rerun_index reruns_;  // Note [Drops for recomputation]
};

// The pairs of blocks that may not share bytes (block::overlaps_in_time), as lists of
// neighbours: a sweep over the blocks' slot spans, then over their device-time spans.
// Empty when there are more than `most` pairs (long-lived blocks in a long iteration meet nearly
// every other block), which would cost more memory and time than the packing is worth.
std::vector<std::vector<std::uint32_t>> conflicts(const std::vector<block>& blocks, std::size_t most) {
  std::vector<std::vector<std::uint32_t>> adj(blocks.size());
  std::size_t pairs = 0;
  auto sweep = [&](auto&& spans_of) {
    std::vector<std::tuple<double, double, std::uint32_t>> spans;  // from, to, block
    for (std::uint32_t i = 0; i < blocks.size(); ++i) spans_of(blocks[i], i, spans);
    std::sort(spans.begin(), spans.end());
    // Spans [f, t) and [g, u) with f <= g meet when g < t and f < u; as in overlaps_in_time, an
    // empty span meets one that holds its point strictly inside.
    std::vector<std::tuple<double, double, std::uint32_t>> active;  // to, from, block
    for (const auto& [from, to, i] : spans) {
      std::erase_if(active, [from = from](const auto& a) { return std::get<0>(a) <= from; });
      for (const auto& [a_to, a_from, a] : active) {
        if (a == i || !(a_from < to)) continue;
        adj[i].push_back(a);
        adj[a].push_back(i);
      }
      pairs += active.size();
      if (pairs > most) return false;
      active.emplace_back(to, from, i);
    }
    return true;
  };
  const bool few = sweep([](const block& b, std::uint32_t i, auto& out) {
    for (int k = 0; k < b.span_count; ++k) out.emplace_back(b.spans[k].first, b.spans[k].second, i);
  }) && sweep([](const block& b, std::uint32_t i, auto& out) {
    for (int k = 0; k < b.time_count; ++k) out.emplace_back(b.times[k].first, b.times[k].second, i);
  });
  if (!few) return {};
  for (auto& a : adj) {
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
  }
  return adj;
}

// Note [Lowest first]: places every block at its floor (the top of the highest block placed so
// far that it may not share bytes with), the block with the lowest floor first, ties to the
// highest `key`. Returns the extent; `order` gets the blocks in the order they were placed.
std::size_t pack_lowest_first(std::vector<block>& blocks, const std::vector<std::vector<std::uint32_t>>& adj,
                              const std::vector<double>& key, std::vector<std::size_t>& order) {
  const std::size_t n = blocks.size();
  std::vector<std::size_t> floor(n, 0);
  std::vector<char> done(n, 0);
  using entry = std::tuple<std::size_t, double, std::size_t>;  // floor, -key, block
  std::priority_queue<entry, std::vector<entry>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i) ready.emplace(0, -key[i], i);
  order.clear();
  std::size_t extent = 0;
  while (!ready.empty()) {
    const auto [f, k, i] = ready.top();
    ready.pop();
    if (done[i] || f != floor[i]) continue;  // placed, or its floor has risen since
    done[i] = 1;
    order.push_back(i);
    blocks[i].offset = f;
    const std::size_t top = f + blocks[i].bytes;
    extent = std::max(extent, top);
    for (const auto j : adj[i])
      if (!done[j] && floor[j] < top) {
        floor[j] = top;
        ready.emplace(top, -key[j], j);
      }
  }
  return extent;
}

}  // namespace

std::optional<std::size_t> device_layout::offset(tensor_id id, std::uint32_t slot) const {
  auto it = offsets.find(key_of(id, slot));
  if (it == offsets.end()) return std::nullopt;
  return it->second;
}

device_layout make_layout(const trace& t, const plan& p, std::span<const std::int64_t> release_after,
                          const plan_timing* timing, const layout_search& search) {
  constexpr double shake_spreads[] = {0.05, 0.1, 0.2, 0.4};
  auto blocks = residency(t, p, release_after, timing).run();
  device_layout out;
  out.blocks = blocks.size();
  const std::uint32_t end = layout_slot::end(t.ops.size());
  std::vector<std::int64_t> live(end + 2, 0);
  for (const auto& b : blocks) {
    for (int i = 0; i < b.span_count; ++i) {
      live[b.spans[i].first] += static_cast<std::int64_t>(b.bytes);
      live[b.spans[i].second] -= static_cast<std::int64_t>(b.bytes);
    }
  }
  std::int64_t cur = 0;
  std::vector<std::size_t> level(live.size(), 0);  // bytes alive at each slot
  for (std::size_t i = 0; i < live.size(); ++i) {
    cur += live[i];
    level[i] = static_cast<std::size_t>(cur);
    out.peak_live = std::max(out.peak_live, level[i]);
  }
  // Each block's breadth: the most bytes alive at a slot of its life (a sparse table of maxima).
  std::vector<std::vector<std::size_t>> table{level};
  for (std::size_t w = 1; 2 * w <= level.size(); w *= 2) {
    const auto& prev = table.back();
    std::vector<std::size_t> next(prev.size() - w);
    for (std::size_t i = 0; i < next.size(); ++i) next[i] = std::max(prev[i], prev[i + w]);
    table.push_back(std::move(next));
  }
  auto range_max = [&](std::size_t a, std::size_t b) -> std::size_t {  // max of level[a, b)
    if (b <= a) return 0;
    std::size_t k = 0;
    while ((std::size_t{2} << k) <= b - a) ++k;
    return std::max(table[k][a], table[k][b - (std::size_t{1} << k)]);
  };
  for (auto& b : blocks)
    for (int i = 0; i < b.span_count; ++i) b.breadth = std::max(b.breadth, range_max(b.spans[i].first, b.spans[i].second));

  // Several orders, each with first-fit and smallest-fitting gaps; the tightest packing wins:
  // largest first (ties: longest-lived, or earliest), longest-lived first, largest area
  // (bytes x time) first, and those alive at the busiest slots first (largest first among them).
  using order_fn = bool (*)(const block&, const block&);
  const order_fn orders[] = {
      [](const block& a, const block& b) { return a.bytes != b.bytes ? a.bytes > b.bytes : a.duration() > b.duration(); },
      [](const block& a, const block& b) { return a.duration() != b.duration() ? a.duration() > b.duration() : a.bytes > b.bytes; },
      [](const block& a, const block& b) {
        const double x = static_cast<double>(a.bytes) * static_cast<double>(a.duration());
        const double y = static_cast<double>(b.bytes) * static_cast<double>(b.duration());
        return x != y ? x > y : a.bytes > b.bytes;
      },
      [](const block& a, const block& b) { return a.bytes != b.bytes ? a.bytes > b.bytes : a.spans[0].first < b.spans[0].first; },
      [](const block& a, const block& b) { return a.breadth != b.breadth ? a.breadth > b.breadth : a.bytes > b.bytes; },
  };
  std::vector<std::size_t> best_offsets, best_order;
  std::size_t best_extent = 0;
  std::vector<std::size_t> order(blocks.size());
  std::vector<std::size_t> placed;  // blocks placed so far, by offset
  std::size_t top = 0;              // the block ending highest in the last packing
  std::size_t compared = 0;         // blocks compared with those placed, against the refinement's work
  // Places order[from..] after order[..from), which keep their offsets, each among the gaps
  // between the blocks alive with it (lowest offsets first): the first that fits, or the smallest
  // that fits; else above them all. Returns the packing's extent; `top` names its highest block.
  auto pack = [&](bool best_gap, std::size_t from) {
    placed.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(from));
    std::sort(placed.begin(), placed.end(), [&](std::size_t a, std::size_t b) { return blocks[a].offset < blocks[b].offset; });
    std::size_t extent = 0;
    for (auto j : placed)
      if (blocks[j].offset + blocks[j].bytes > extent) {
        extent = blocks[j].offset + blocks[j].bytes;
        top = j;
      }
    for (std::size_t n = from; n < order.size(); ++n) {
      const auto i = order[n];
      auto& b = blocks[i];
      std::size_t at = 0, best = SIZE_MAX, best_size = SIZE_MAX;
      for (auto j : placed) {
        const auto& o = blocks[j];
        ++compared;
        if (!best_gap && o.offset >= at + b.bytes) break;
        if (!b.overlaps_in_time(o)) continue;
        if (o.offset >= at + b.bytes && o.offset - at < best_size) {
          best = at;
          best_size = o.offset - at;
        }
        at = std::max(at, o.offset + o.bytes);
      }
      if (best_gap && best != SIZE_MAX) at = best;
      b.offset = at;
      if (at + b.bytes > extent) {
        extent = at + b.bytes;
        top = i;
      }
      placed.insert(std::upper_bound(placed.begin(), placed.end(), at,
                                     [&](std::size_t off, std::size_t j) { return off < blocks[j].offset; }),
                    i);
    }
    return extent;
  };
  // Keeps the packing just made when it is the tightest so far.
  auto keep_if_tightest = [&](std::size_t extent, layout_packer by) {
    if (!best_offsets.empty() && extent >= best_extent) return;
    best_extent = extent;
    out.packer = by;
    best_order = order;
    best_offsets.clear();
    for (const auto& b : blocks) best_offsets.push_back(b.offset);
  };
  for (const bool best_gap : {false, true})
    for (const auto cmp : orders) {
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return cmp(blocks[a], blocks[b]); });
      keep_if_tightest(pack(best_gap, 0), layout_packer::fixed_order);
    }
  // Note [Lowest first], with four rules for ties; each placement order is also packed first
  // fit, which may find lower gaps than the floors.
  {
    constexpr std::size_t most_pairs = 4'000'000;  // 32 MB of neighbour lists
    const auto adj = conflicts(blocks, most_pairs);
    std::vector<double> key(blocks.size());
    for (int rule = 0; rule < 4 && !adj.empty(); ++rule) {
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        const auto& b = blocks[i];
        const double area = static_cast<double>(b.bytes) * static_cast<double>(b.duration());
        key[i] = rule == 0   ? area
                 : rule == 1 ? area + 1e-3 * static_cast<double>(adj[i].size())
                 : rule == 2 ? static_cast<double>(b.bytes)
                             : static_cast<double>(b.duration()) * 1e15 + static_cast<double>(b.bytes);
      }
      keep_if_tightest(pack_lowest_first(blocks, adj, key, order), layout_packer::lowest_first);
      keep_if_tightest(pack(false, 0), layout_packer::lowest_first);
    }
  }
  // Note [Shaken orders]: largest first, each size shaken by a random factor; first fit. The
  // generator has a fixed seed: the same plan always packs the same way.
  std::mt19937_64 rng(0x5b111a7);
  std::vector<double> key(blocks.size());
  for (std::size_t r = 0; r < search.shaken_orders; ++r) {
    const double spread = shake_spreads[r % std::size(shake_spreads)];
    std::uniform_real_distribution<double> u(1.0 - spread, 1.0 + spread);
    for (std::size_t i = 0; i < blocks.size(); ++i) key[i] = static_cast<double>(blocks[i].bytes) * u(rng);
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) {
      return key[a] != key[b] ? key[a] > key[b] : blocks[a].duration() > blocks[b].duration();
    });
    keep_if_tightest(pack(false, 0), layout_packer::shaken_order);
  }
  // Note [Refined orders]: from the tightest order, move the block that ends highest earlier, or
  // one it rests on later, and keep the order when it packs no looser.
  if (search.refine_repacks > 0 && best_extent > std::max(search.goal, out.peak_live) && blocks.size() > 1) {
    order = best_order;
    compared = 0;
    std::size_t current = pack(false, 0);
    // The work, counted in blocks compared with those placed: `refine_repacks` whole packings'
    // worth, and never more than about two seconds' worth.
    constexpr std::size_t most_compared = 400'000'000;
    const std::size_t work = std::min(most_compared, search.refine_repacks * std::max<std::size_t>(compared, 1));
    keep_if_tightest(current, out.packer);
    std::size_t current_top = top;
    std::vector<std::size_t> current_order = order, current_offsets(blocks.size());
    for (std::size_t i = 0; i < blocks.size(); ++i) current_offsets[i] = blocks[i].offset;
    std::vector<std::size_t> below;  // places before the top block's, of blocks alive with it
    compared = 0;
    while (compared < work && best_extent > std::max(search.goal, out.peak_live)) {
      order = current_order;
      const auto pos = static_cast<std::size_t>(std::find(order.begin(), order.end(), current_top) - order.begin());
      below.clear();
      if (rng() & 1)
        for (std::size_t q = 0; q < pos; ++q)
          if (blocks[order[q]].overlaps_in_time(blocks[current_top])) below.push_back(q);
      std::size_t from = 0;
      if (!below.empty()) {  // one the top block rests on goes after it
        const auto q = below[rng() % below.size()];
        const auto moved = order[q];
        order.erase(order.begin() + static_cast<std::ptrdiff_t>(q));
        const auto to = pos + rng() % (order.size() - pos + 1);
        order.insert(order.begin() + static_cast<std::ptrdiff_t>(to), moved);
        from = q;
      } else if (pos > 0) {  // the top block goes earlier
        const auto to = rng() % pos;
        order.erase(order.begin() + static_cast<std::ptrdiff_t>(pos));
        order.insert(order.begin() + static_cast<std::ptrdiff_t>(to), current_top);
        from = to;
      } else {  // the top block is first already: another takes its place
        std::swap(order[0], order[1 + rng() % (order.size() - 1)]);
      }
      const std::size_t extent = pack(false, from);
      if (extent <= current) {
        keep_if_tightest(extent, layout_packer::refined_order);
        current = extent;
        current_top = top;
        current_order = order;
        for (std::size_t i = 0; i < blocks.size(); ++i) current_offsets[i] = blocks[i].offset;
      } else {
        // Not kept; half the time the block that ended highest in it is the next to move, so
        // that a search stuck on one top block tries others.
        if (rng() & 1) current_top = top;
        for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].offset = current_offsets[i];
      }
    }
  }
  out.extent = best_extent;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    for (int k = 0; k < b.key_count; ++k) out.offsets[key_of(b.id, b.keys[k])] = best_offsets[i];
    out.placed.push_back(layout_block{b.id, b.bytes, best_offsets[i], {b.spans.begin(), b.spans.begin() + b.span_count},
                                      {b.times.begin(), b.times.begin() + b.time_count}});
  }
  return out;
}

}  // namespace spillway
