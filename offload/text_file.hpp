// Reading a whole input file (a trace, a hardware profile, a settings file) with errors that
// name the path and say what was expected there.
#pragma once

#include <string>
#include <string_view>

namespace spillway::offload {

/// The bytes of the file at `path`. `what` names it in errors ("the trace"), `wanted` says what
/// to give instead ("a trace JSON file"). config_error naming the path when it is a folder, or
/// cannot be opened or read.
[[nodiscard]] std::string read_text_file(const std::string& path, std::string_view what, std::string_view wanted);

}  // namespace spillway::offload
