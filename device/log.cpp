// Process-wide logging hook.
// A mutex guards the sink so that a program may swap it while streams are running.
#include "device/log.hpp"

#include <mutex>

namespace spillway {
namespace {
std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}
log_sink& sink() {
  static log_sink s;
  return s;
}
}  // namespace

log_sink set_log_sink(log_sink s) {
  std::lock_guard lock(sink_mutex());
  auto previous = std::move(sink());
  sink() = std::move(s);
  return previous;
}

void log(log_level level, const std::string& message) {
  std::lock_guard lock(sink_mutex());
  if (sink()) sink()(level, message);
}

const char* to_string(log_level level) noexcept {
  switch (level) {
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warning: return "warning";
    case log_level::error: return "error";
  }
  return "?";
}

}  // namespace spillway
