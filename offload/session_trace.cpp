// Chrome trace writer for real iterations (the simulator's timeline has its own in bench/).
// One process, one thread per track; the memory counter carries the budget as a second series.
#include "offload/session_trace.hpp"

#include <nlohmann/json.hpp>

#include "offload/text_file.hpp"

namespace spillway::offload {

void write_session_chrome_trace(const std::string& path, const std::deque<timeline_item>& items,
                                const std::vector<memory_sample>& memory, std::uint64_t budget_bytes) {
  nlohmann::json events = nlohmann::json::array();
  // Indexed by timeline_item::track.
  const char* track_names[] = {"compute",    "copy host->device", "copy device->host", "stalls",
                               "nvme read",  "nvme write",        "host ops",          "recompute"};
  for (int tid = 0; tid < 8; ++tid) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", tid}, {"args", {{"name", track_names[tid]}}}});
  }
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", "spillway session"}}}});
  for (const auto& it : items) {
    if (it.start_us < 0 || it.end_us < it.start_us) continue;  // not run (yet)
    events.push_back({{"ph", "X"},
                      {"name", it.name},
                      {"pid", 1},
                      {"tid", static_cast<int>(it.where)},
                      {"ts", it.start_us},
                      {"dur", it.end_us - it.start_us}});
  }
  for (const auto& m : memory) {
    events.push_back({{"ph", "C"},
                      {"name", "device memory (bytes)"},
                      {"pid", 1},
                      {"ts", m.at_us},
                      {"args", {{"in use", m.bytes}, {"budget", budget_bytes}}}});
  }
  write_text_file(path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n",
                  "the Chrome trace");
}

}  // namespace spillway::offload
