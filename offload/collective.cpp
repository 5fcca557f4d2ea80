// Collectives: names, ring costs (Note [Ring collectives] in collective.hpp) and the schedule
// the simulator's network stream reads.
#include "offload/collective.hpp"

#include <algorithm>
#include <string>

#include "device/error.hpp"

namespace spillway::offload {

namespace {
constexpr std::string_view kind_names[] = {"reduce_scatter", "all_gather", "all_reduce"};
}

std::string_view to_string(collective_kind k) noexcept { return kind_names[static_cast<int>(k)]; }

std::optional<collective_kind> parse_collective_kind(std::string_view s) noexcept {
  for (int i = 0; i < 3; ++i)
    if (kind_names[i] == s) return static_cast<collective_kind>(i);
  return std::nullopt;
}

ring_cost ring_cost_of(collective_kind k, std::uint64_t bytes, std::uint32_t ranks) noexcept {
  if (ranks <= 1) return {};
  // (N-1)/N of the buffer, in chunks of ceil(B/N): the largest rank's part bounds each step.
  const std::uint64_t chunk = (bytes + ranks - 1) / ranks;
  const std::uint64_t once = chunk * (ranks - 1);
  if (k == collective_kind::all_reduce) return {2 * once, 2 * (ranks - 1)};
  return {once, ranks - 1};
}

const collective* comm_schedule::find(op_index k) const noexcept {
  auto it = std::lower_bound(collectives.begin(), collectives.end(), k,
                             [](const collective& c, op_index v) { return c.op < v; });
  return it != collectives.end() && it->op == k ? &*it : nullptr;
}

void comm_schedule::validate(const trace& t) const {
  SPILLWAY_EXPECTS_T(usage_error, ranks >= 1, "comm_schedule: ranks must be at least 1");
  for (std::size_t i = 0; i < collectives.size(); ++i) {
    const auto& c = collectives[i];
    SPILLWAY_EXPECTS_T(usage_error, c.op < t.ops.size(),
                       "comm_schedule: collectives[" + std::to_string(i) + "] names op " + std::to_string(c.op) +
                           ", past the trace's " + std::to_string(t.ops.size()) + " ops");
    SPILLWAY_EXPECTS_T(usage_error, i == 0 || collectives[i - 1].op < c.op,
                       "comm_schedule: collectives[" + std::to_string(i) + "] (op " + std::to_string(c.op) +
                           ") is listed twice or out of order");
  }
}

std::uint64_t comm_schedule::wire_bytes() const noexcept {
  std::uint64_t b = 0;
  for (const auto& c : collectives) b += ring_cost_of(c.kind, c.bytes, ranks).wire_bytes;
  return b;
}

}  // namespace spillway::offload
