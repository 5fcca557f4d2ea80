// Swap file setup: checks the directory, opens an unnamed 0600 file (O_TMPFILE, else a named
// file unlinked at once), asks the file system for its O_DIRECT alignment, reserves the space.
#include "swap/swap_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include "device/error.hpp"
#include "device/log.hpp"
#include "device/units.hpp"

namespace spillway {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

int default_open(const std::string& path, int flags, mode_t mode) {
  const int fd = ::open(path.c_str(), flags, mode);
  return fd >= 0 ? fd : -errno;
}

// O_DIRECT alignment: statx's STATX_DIOALIGN where the kernel reports it, else the file
// system's block size from fstatvfs (at least 512), else 4096.
std::uint32_t direct_alignment(int fd) {
  std::uint32_t align = 0;
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) != 0)
    align = std::max(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
#endif
  if (align == 0) {
    struct statvfs vfs {};
    if (::fstatvfs(fd, &vfs) == 0 && vfs.f_bsize >= 512) align = static_cast<std::uint32_t>(vfs.f_bsize);
  }
  if (align == 0 || (align & (align - 1)) != 0) align = 4096;
  return std::max<std::uint32_t>(align, 512);
}

std::uint64_t free_bytes(int fd) {
  struct statvfs vfs {};
  if (::fstatvfs(fd, &vfs) != 0) return ~std::uint64_t{0};
  return static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

// Reserves [offset, offset + len) of the swap file (fallocate). out_of_memory naming the
// directory when the file system cannot hold it; buffered sizing where fallocate is missing.
void reserve_space(int fd, const std::string& where, std::uint64_t offset, std::uint64_t len) {
  if (len == 0) return;
  auto too_little = [&](std::uint64_t available) {
    return out_of_memory(where + " has too little free space: " + format_bytes(len) + " (" + std::to_string(len) +
                         " bytes)" + (offset == 0 ? " asked for, " : " more asked for, ") + format_bytes(available) + " (" + std::to_string(available) +
                         " bytes) free");
  };
  if (const std::uint64_t available = free_bytes(fd); available < len) throw too_little(available);
  const int rc = ::posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(len));
  if (rc == ENOSPC || rc == EDQUOT) throw too_little(free_bytes(fd));  // the disk, or the user's quota on it
  if (rc == EOPNOTSUPP || rc == EINVAL) {
    if (::ftruncate(fd, static_cast<off_t>(offset + len)) != 0)
      throw io_error(where + ": cannot size the swap file: " + errno_text(errno), errno);
    log(log_level::warning, where + " cannot reserve space up front (no fallocate); a full disk "
                                    "will show up as a write error");
  } else if (rc != 0) {
    throw io_error(where + ": cannot reserve " + format_bytes(len) + ": " + errno_text(rc), rc);
  }
}

// Opens an unnamed file in `dir` with `extra` flags: O_TMPFILE, or a random name unlinked at
// once where the file system has no O_TMPFILE. Returns an fd or -errno.
int open_unnamed(const file_opener& opener, const std::string& dir, int extra) {
  int fd = opener(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | extra, 0600);
  if (fd >= 0 || (fd != -EOPNOTSUPP && fd != -EISDIR)) return fd;
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string path = dir + "/.spillway-swap-" + std::to_string(rd()) + std::to_string(rd());
    fd = opener(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | extra, 0600);
    if (fd == -EEXIST) continue;
    if (fd >= 0) ::unlink(path.c_str());
    return fd;
  }
  return -EEXIST;
}

}  // namespace

swap_file::~swap_file() {
  if (fd_ >= 0) ::close(fd_);
}

swap_file::swap_file(swap_file&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), directory_(std::move(o.directory_)), bytes_(o.bytes_),
      alignment_(o.alignment_), direct_(o.direct_) {}

swap_file& swap_file::operator=(swap_file&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    directory_ = std::move(o.directory_);
    bytes_ = o.bytes_;
    alignment_ = o.alignment_;
    direct_ = o.direct_;
  }
  return *this;
}

swap_file open_swap_file(const std::string& directory, std::uint64_t bytes, const file_opener& opener_in) {
  const file_opener opener = opener_in ? opener_in : file_opener(default_open);
  const std::string where = "swap directory '" + directory + "'";
  struct stat st {};
  if (::stat(directory.c_str(), &st) != 0)
    throw config_error(where + " cannot be used: " + errno_text(errno));
  if (!S_ISDIR(st.st_mode)) throw config_error(where + " is not a directory");

  swap_file f;
  f.directory_ = directory;
  f.bytes_ = bytes;
  int fd = open_unnamed(opener, directory, O_DIRECT);
  if (fd == -EINVAL) {  // this file system refuses O_DIRECT: buffered I/O still works
    fd = open_unnamed(opener, directory, 0);
    if (fd >= 0)
      log(log_level::warning, where + " does not support O_DIRECT; using buffered I/O (the page cache "
                                      "will hold a copy of swapped tensors)");
  } else if (fd >= 0) {
    f.direct_ = true;
  }
  if (fd < 0) {
    if (fd == -EACCES || fd == -EPERM || fd == -EROFS)
      throw config_error(where + " is not writable: " + errno_text(-fd));
    throw config_error(where + ": cannot create a swap file: " + errno_text(-fd));
  }
  f.fd_ = fd;
  f.alignment_ = direct_alignment(fd);

  reserve_space(fd, where, 0, bytes);
  return f;
}

void swap_file::grow(std::uint64_t new_bytes) {
  if (new_bytes <= bytes_) return;
  reserve_space(fd_, "swap directory '" + directory_ + "'", bytes_, new_bytes - bytes_);
  bytes_ = new_bytes;
}

std::uint64_t swap_file::free_space() const noexcept { return fd_ >= 0 ? free_bytes(fd_) : 0; }

dev_t swap_file::file_system() const noexcept {
  struct stat st {};
  return fd_ >= 0 && ::fstat(fd_, &st) == 0 ? st.st_dev : dev_t{0};
}

}  // namespace spillway
