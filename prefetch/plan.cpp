// Plan: string forms of the enums, the empty plan, and structural validation.
// Memory and timing checks belong to the simulator in offload/.
#include "prefetch/plan.hpp"

#include "device/error.hpp"
#include "prefetch/enum_names.hpp"

namespace spillway {

namespace {
constexpr std::string_view action_names[] = {"evict_to_host", "evict_to_nvme", "drop"};
}  // namespace

// The tier's names are swap/tier.hpp's to_string(tier); this only gives them a string_view and a parse.
std::string_view tier_name(tier t) noexcept { return to_string(t); }

std::optional<tier> parse_tier(std::string_view s) noexcept {
  for (tier t : {tier::device, tier::host, tier::nvme})
    if (to_string(t) == s) return t;
  return std::nullopt;
}

std::string_view to_string(evict_action a) noexcept { return detail::enum_name(action_names, a); }

std::optional<evict_action> parse_evict_action(std::string_view s) noexcept {
  return detail::parse_enum<evict_action>(action_names, s);
}

plan plan::empty_for(const trace& t, std::string policy, std::uint64_t budget) {
  plan p;
  p.policy = std::move(policy);
  p.budget_bytes = budget;
  p.initial_tier.assign(t.tensors.size(), tier::device);
  p.steps.resize(t.ops.size());
  return p;
}

void plan::validate(const trace& t) const {
  // A plan that does not fit its trace was made for another one: a misuse of the plan.
  SPILLWAY_EXPECTS_T(usage_error, steps.size() == t.ops.size(),
                     "plan: has " + std::to_string(steps.size()) + " steps for a trace of " +
                         std::to_string(t.ops.size()) + " ops");
  SPILLWAY_EXPECTS_T(usage_error, initial_tier.size() == t.tensors.size(),
                     "plan: field 'initial_tier' has " + std::to_string(initial_tier.size()) + " entries for " +
                         std::to_string(t.tensors.size()) + " tensors");
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const auto where = [&] { return "plan: step " + std::to_string(k) + " ('" + t.ops[k].name + "')"; };
    for (const auto& p : steps[k].prefetches) {
      SPILLWAY_EXPECTS_T(usage_error, p.tensor < t.tensors.size(),
                         where() + ": prefetch names tensor " + std::to_string(p.tensor) + " out of range");
      SPILLWAY_EXPECTS_T(usage_error, p.use >= k && p.use < t.ops.size(),
                         where() + ": prefetch of '" + t.tensors[p.tensor].name + "' for op " +
                             std::to_string(p.use) + " is not at or after its issue point");
      SPILLWAY_EXPECTS_T(usage_error, p.from != tier::device,
                         where() + ": prefetch of '" + t.tensors[p.tensor].name + "' from the device");
    }
    for (op_index o : steps[k].recomputes) {
      SPILLWAY_EXPECTS_T(usage_error, o < k,
                         where() + ": recomputes op " + std::to_string(o) + ", which is not an earlier op");
      SPILLWAY_EXPECTS_T(usage_error, t.ops[o].recomputable,
                         where() + ": recomputes op " + std::to_string(o) + " ('" + t.ops[o].name +
                             "'), which the trace does not mark recomputable");
    }
    SPILLWAY_EXPECTS_T(usage_error, !steps[k].on_host || t.ops[k].host_capable,
                       where() + ": is placed on the host, but the trace does not mark the op host_capable");
    for (op_index o : steps[k].recomputes)
      SPILLWAY_EXPECTS_T(usage_error, !steps[o].on_host,
                         where() + ": recomputes op " + std::to_string(o) + " ('" + t.ops[o].name +
                             "'), which the plan places on the host");
    for (const auto& e : steps[k].evictions)
      SPILLWAY_EXPECTS_T(usage_error, e.tensor < t.tensors.size(),
                         where() + ": eviction names tensor " + std::to_string(e.tensor) + " out of range");
  }
}

std::size_t plan::eviction_count() const noexcept {
  std::size_t n = 0;
  for (const auto& s : steps) n += s.evictions.size();
  return n;
}

std::size_t plan::prefetch_count() const noexcept {
  std::size_t n = 0;
  for (const auto& s : steps) n += s.prefetches.size();
  return n;
}

std::size_t plan::recompute_count() const noexcept {
  std::size_t n = 0;
  for (const auto& s : steps) n += s.recomputes.size();
  return n;
}

std::size_t plan::host_op_count() const noexcept {
  std::size_t n = 0;
  for (const auto& s : steps) n += s.on_host ? 1 : 0;
  return n;
}

}  // namespace spillway
