// Chrome trace of a Session's real iterations: compute, H2D and D2H tracks, stalls, and a
// device-memory counter with the budget line, in the JSON that Perfetto and chrome://tracing read.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "prefetch/executor.hpp"

namespace spillway::offload {

/// Writes the executor's timeline as a Chrome trace to `path`; throws io_error naming the file
/// and the errno when it cannot be written.
void write_session_chrome_trace(const std::string& path, const std::deque<timeline_item>& items,
                                const std::vector<memory_sample>& memory, std::uint64_t budget_bytes);

}  // namespace spillway::offload
