#include "offload/text_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "device/error.hpp"

namespace spillway::offload {

std::string read_text_file(const std::string& path, std::string_view what, std::string_view wanted) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw config_error(path + ": is a folder; give " + std::string(wanted));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(path + ": cannot open " + std::string(what) + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw config_error(path + ": cannot read " + std::string(what) + ": " + std::strerror(errno));
  return ss.str();
}

namespace {

// Writes all of `bytes` to `fd`; the errno of the first failure, 0 when all went.
int write_all(int fd, std::string_view bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return ENOSPC;
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

[[noreturn]] void fail(const std::string& path, std::string_view what, const char* step, int err) {
  throw io_error(path + ": cannot " + step + " " + std::string(what) + ": " + std::strerror(err), err);
}

}  // namespace

void write_text_file(const std::string& given, std::string_view bytes, std::string_view what) {
  // A link is followed, so the file it names is replaced and the link stays.
  std::string path = given;
  struct stat st {};
  if (::lstat(given.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    if (char* real = ::realpath(given.c_str(), nullptr)) {
      path = real;
      std::free(real);
    }
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw io_error(path + ": cannot write " + std::string(what) + ": it is a folder; give a file name in it", EISDIR);
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(path, what, "open", errno);
    const int err = write_all(fd, bytes);
    const int closed = ::close(fd) == 0 ? 0 : errno;
    if (err != 0 || closed != 0) fail(path, what, "write", err != 0 ? err : closed);
    return;
  }
  static std::atomic<unsigned> serial{0};
  const std::string temp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, what, "write", errno);
  int err = write_all(fd, bytes);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    fail(path, what, "write", err);
  }
}

}  // namespace spillway::offload
