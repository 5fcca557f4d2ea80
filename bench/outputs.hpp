// Output files of spillway-bench: each written whole (offload/text_file.hpp) under the flag that
// named it, and checked before any work: no output is one of the run's inputs or another output.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace spillway::bench {

/// Writes `bytes` as the whole file at `path` through offload::write_text_file: a full disk or a
/// failed write leaves the earlier file as it was. `flag` names the file in errors ("--json").
/// io_error naming the path, the flag and the reason.
void write_output(const std::string& path, std::string_view bytes, std::string_view flag);

/// A file a run reads or writes, with the flag that named it ("--trace", "--json").
struct named_file {
  std::string flag;
  std::string path;
};

/// Before any work: config_error when an output is the same file as an input (the same path
/// once made absolute, or one file by device and inode when both exist) or as another output,
/// since writing it would replace what the run reads or what it wrote a moment before. Empty
/// paths (a flag not given) are skipped; a device, pipe or terminal (/dev/stdout) may be shared.
void check_outputs(const std::vector<named_file>& outputs, const std::vector<named_file>& inputs = {});

/// Before any work: config_error naming `flag` when the folder of `path` is missing or cannot
/// be written, or `path` is a folder (the check of writable_file, for a path the program chose).
void check_writable(const std::string& path, std::string_view flag);

}  // namespace spillway::bench
