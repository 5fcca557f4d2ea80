// Checkpoint files: the format Session::save writes and Session::load reads, the atomic write
// (temporary file, fsync, rename, fsync of the folder) and the checks that a checkpoint matches.
//
// A checkpoint is one file, DIR/checkpoint.spw (Note [Checkpoint format]). One file means one
// rename: a reader sees the old checkpoint or the new one, never a mix. Nothing here knows the
// Session: the writer takes a list of tensors and a callback that hands over each one's bytes in
// chunks; the reader checks a list against the file and hands bytes back per tensor.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "prefetch/trace.hpp"

namespace spillway::checkpoint {

// Note [Checkpoint format]
// Little-endian throughout. A 64-byte header, the tensors' bytes one after another, then an
// index:
//   header: magic "SPWCKPT1" (8), format version u32 (= 2), 0 u32, index offset u64, index
//           bytes u64, CRC32C of the index u32, CRC32C of the header's first 36 bytes u32, zeros.
//   index:  meta length u64 and its bytes; tensor count u64; per tensor: name length u32, name,
//           kind length u32, kind (as to_string(tensor_kind) writes it), bytes u64, offset of its
//           bytes in the file u64, CRC32C of its bytes u32; then the Session's state: the
//           iterations it had ended u64 (session_state).
// Format 1 is format 2 without the Session's state; the reader takes both.
// The header is written last (at offset 0, once the index is known), then the file is synced
// and renamed into place: a file that ends early or lost its header is refused as such.

/// The checkpoint's file in its folder.
inline constexpr std::string_view file_name = "checkpoint.spw";
/// Temporary files of saves in progress start with this (".tmp-checkpoint.spw.<pid>.<n>").
inline constexpr std::string_view temp_prefix = ".tmp-checkpoint.spw.";

/// One tensor of a checkpoint.
struct entry {
  std::string name;
  std::uint64_t bytes = 0;
  tensor_kind kind = tensor_kind::parameter;
};

/// Takes `bytes` bytes at `data`: the next part of the tensor being written.
using chunk_sink = std::function<void(const void* data, std::uint64_t bytes)>;
/// Hands the bytes of entries[index] to `sink`, in order, in chunks of any size that add up to
/// the entry's size.
using tensor_source = std::function<void(std::size_t index, const chunk_sink& sink)>;

/// What a checkpoint keeps of the Session besides its tensors.
struct session_state {
  /// Iterations the Session had ended, which number its op seeds (Note [Op seeds] in
  /// offload/session.cpp).
  std::uint64_t iterations = 0;
};

struct write_options {
  /// Called after each write to the temporary file with the file's bytes so far (tests use it to
  /// stop a save midway). Null: not called.
  std::function<void(std::uint64_t bytes_written)> on_progress;
};

/// Writes a checkpoint of `entries` (bytes from `source`) with `meta` and `state` into folder
/// `dir`, which is made when missing (its parent must exist). The file is written as a temporary
/// file in `dir`, synced, renamed over DIR/checkpoint.spw and the folder synced: a crash at any
/// point leaves the previous checkpoint whole. Temporary files of saves that died (their process
/// is gone) are removed; none is left behind by this one, whether it succeeds or throws. Names
/// must be unique.
/// Errors: config_error for a `dir` that cannot be a folder, io_error naming the file and errno.
void write(const std::string& dir, const std::vector<entry>& entries, const tensor_source& source,
           std::string_view meta, const write_options& options = {}, const session_state& state = {});

/// An open checkpoint: its index, read and checked when it opens.
class reader {
 public:
  /// Opens DIR/checkpoint.spw and reads its index. config_error when there is no checkpoint
  /// there or the file is not one; corruption_error (naming the file) when its header or index
  /// is damaged or the file ends early.
  explicit reader(const std::string& dir);
  ~reader();
  reader(const reader&) = delete;
  reader& operator=(const reader&) = delete;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] const std::string& meta() const noexcept { return meta_; }
  /// The Session's state when it saved; none for a format 1 file, which does not keep it.
  [[nodiscard]] const std::optional<session_state>& state() const noexcept { return state_; }
  [[nodiscard]] std::vector<entry> entries() const;

  /// config_error naming the first difference between the checkpoint and `expected` (matched by
  /// name): a tensor expected but missing, one of another size or kind, then one the checkpoint
  /// has that is not expected. `what` says what `expected` is ("the Session's persistent tensors").
  void check_matches(const std::vector<entry>& expected, std::string_view what) const;
  /// Reads every tensor's bytes and checks its CRC: corruption_error naming the first tensor
  /// whose bytes differ, and the file.
  void verify() const;
  /// Reads tensor `name`'s bytes into `out` (its size) and checks the CRC (corruption_error).
  void read(std::string_view name, void* out) const;

 private:
  struct item {
    entry e;
    std::uint64_t offset = 0;
    std::uint32_t crc = 0;
  };
  [[nodiscard]] const item& find(std::string_view name) const;
  void read_checked(const item& it, void* out) const;  // out null: CRC only, through a chunk buffer

  std::string path_;
  int fd_ = -1;
  std::string meta_;
  std::optional<session_state> state_;
  std::vector<item> items_;
  std::unordered_map<std::string, std::size_t> by_name_;  // index into items_
};

}  // namespace spillway::checkpoint
