// Swap file setup: one anonymous file per swap directory, O_DIRECT where the file system takes
// it, mode 0600, never visible by name (O_TMPFILE, or unlinked at once), its space reserved.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

namespace spillway {

/// How files are opened: ::open by default. A seam for tests (a file system that refuses
/// O_DIRECT, ...). Returns an fd, or -errno.
using file_opener = std::function<int(const std::string& path, int flags, mode_t mode)>;

/// One open swap file. Closing it (destructor) frees its space: it has no name.
class swap_file {
 public:
  swap_file() = default;
  ~swap_file();
  swap_file(swap_file&& o) noexcept;
  swap_file& operator=(swap_file&& o) noexcept;
  swap_file(const swap_file&) = delete;
  swap_file& operator=(const swap_file&) = delete;

  [[nodiscard]] int fd() const noexcept { return fd_; }
  [[nodiscard]] const std::string& directory() const noexcept { return directory_; }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }
  /// Offset, length and memory alignment O_DIRECT needs here (4096 when the system won't say).
  [[nodiscard]] std::uint32_t alignment() const noexcept { return alignment_; }
  /// True when opened with O_DIRECT; false after falling back to buffered I/O.
  [[nodiscard]] bool direct() const noexcept { return direct_; }
  /// Reserves more space (fallocate) so that the file holds `new_bytes`; nothing when it already
  /// does. out_of_memory naming the directory when the file system cannot hold it (the file
  /// keeps its old size then); io_error when the reservation fails otherwise.
  void grow(std::uint64_t new_bytes);
  /// Bytes free on the file system that holds the file (statvfs), for growing it.
  [[nodiscard]] std::uint64_t free_space() const noexcept;
  /// The file system that holds the file (st_dev): files on one share its free space.
  [[nodiscard]] dev_t file_system() const noexcept;

 private:
  friend swap_file open_swap_file(const std::string&, std::uint64_t, const file_opener&);
  int fd_ = -1;
  std::string directory_;
  std::uint64_t bytes_ = 0;
  std::uint32_t alignment_ = 4096;
  bool direct_ = false;
};

/// Opens a swap file of `bytes` in `directory` and reserves its space (fallocate).
/// Errors, all before anything is written:
///  * config_error when the directory is missing, not a directory, or not writable;
///  * out_of_memory when the file system has less free space than `bytes` (the message names
///    the directory, the bytes asked for and the bytes free).
/// Where O_DIRECT is refused (EINVAL, as on some tmpfs), opens buffered and logs a warning.
[[nodiscard]] swap_file open_swap_file(const std::string& directory, std::uint64_t bytes,
                                       const file_opener& opener = {});

}  // namespace spillway
