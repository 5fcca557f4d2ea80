// The logging hook: library code reports warnings through it and never prints.
// Programs install a sink; without one, messages are dropped.
#pragma once

#include <functional>
#include <string>

namespace spillway {

enum class log_level { debug, info, warning, error };

using log_sink = std::function<void(log_level, const std::string&)>;

/// Installs the process-wide sink (thread-safe); returns the previous one.
log_sink set_log_sink(log_sink sink);

/// Sends one message to the installed sink, if any (thread-safe).
void log(log_level level, const std::string& message);

/// Text for a level ("debug", "info", "warning", "error").
const char* to_string(log_level level) noexcept;

}  // namespace spillway
