// Turns the caching allocator's segments and statistics into PyTorch-shaped JSON.
// The field names match PyTorch's memory snapshot; nothing here touches the allocator's lock.
#include "allocator/snapshot.hpp"

#include <cstdint>

namespace spillway {

namespace {
nlohmann::json to_json(const stat& s) {
  return {{"current", s.current}, {"peak", s.peak}, {"allocated", s.allocated}, {"freed", s.freed}};
}
std::uint64_t as_int(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }
}  // namespace

nlohmann::json to_json(const std::vector<segment_info>& segments) {
  auto out = nlohmann::json::array();
  for (const auto& s : segments) {
    auto blocks = nlohmann::json::array();
    for (const auto& b : s.blocks) {
      blocks.push_back({{"address", static_cast<std::uint64_t>(b.address)},
                        {"size", b.size},
                        {"requested_size", b.requested_size},
                        {"state", b.state},
                        {"stream", as_int(b.stream)}});
    }
    out.push_back({{"address", static_cast<std::uint64_t>(s.address)},
                   {"total_size", s.total_size},
                   {"allocated_size", s.allocated_size},
                   {"requested_size", s.requested_size},
                   {"stream", as_int(s.stream)},
                   {"segment_type", s.segment_type},
                   {"device", 0},
                   {"blocks", std::move(blocks)}});
  }
  return out;
}

nlohmann::json to_json(const allocator_stats& s) {
  return {{"allocated_bytes", to_json(s.allocated_bytes)},
          {"requested_bytes", to_json(s.requested_bytes)},
          {"reserved_bytes", to_json(s.reserved_bytes)},
          {"allocation", to_json(s.allocation_count)},
          {"segment", to_json(s.segment_count)},
          {"num_alloc_retries", s.num_alloc_retries},
          {"num_ooms", s.num_ooms},
          {"num_stream_handoffs", s.num_stream_handoffs},
          {"num_segment_releases", s.num_segment_releases}};
}

nlohmann::json memory_snapshot(const caching_allocator& allocator) {
  return {{"segments", to_json(allocator.segments())},
          {"stats", to_json(allocator.stats())},
          {"budget", allocator.budget()}};
}

}  // namespace spillway
