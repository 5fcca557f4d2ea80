// Memory snapshot as JSON with the field names of PyTorch's torch.cuda.memory._snapshot(), so
// tools and habits made for that carry over: {"segments": [{address, total_size, blocks...}]}.
#pragma once

#include <nlohmann/json.hpp>

#include "allocator/caching_allocator.hpp"

namespace spillway {

/// {"segments": [...], "stats": {...}, "budget": n}; addresses and streams as integers.
[[nodiscard]] nlohmann::json memory_snapshot(const caching_allocator& allocator);

/// The segments alone, as PyTorch's snapshot lists them.
[[nodiscard]] nlohmann::json to_json(const std::vector<segment_info>& segments);

/// The statistics, PyTorch memory_stats() style ("allocated_bytes": {current, peak, allocated, freed}).
[[nodiscard]] nlohmann::json to_json(const allocator_stats& stats);

}  // namespace spillway
