// Reading a whole input file (a trace, a hardware profile, a settings file) with errors that
// name the path and say what was expected there, and writing a whole output file (a report, a
// Chrome trace, a table) so that it is there complete or not changed at all.
#pragma once

#include <string>
#include <string_view>

namespace spillway::offload {

/// The bytes of the file at `path`. `what` names it in errors ("the trace"), `wanted` says what
/// to give instead ("a trace JSON file"). config_error naming the path when it is a folder, or
/// cannot be opened or read.
[[nodiscard]] std::string read_text_file(const std::string& path, std::string_view what, std::string_view wanted);

/// Writes `bytes` as the whole file at `path`: into a temporary file beside it, checked once
/// closed, then renamed over it, so a full disk or a crash leaves the earlier file as it was,
/// never a cut one. A path that exists and is not a regular file (a terminal, /dev/stdout, a
/// pipe) is written in place, and checked. `what` names it in errors ("the Chrome trace").
/// io_error naming the path and the reason when any step fails; the temporary file is removed.
void write_text_file(const std::string& path, std::string_view bytes, std::string_view what);

}  // namespace spillway::offload
