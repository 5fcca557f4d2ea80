// Checkpoint files: writing one atomically (temporary file, fsync, rename, fsync of the folder)
// and reading one back with its index and every tensor's CRC checked (Note [Checkpoint format]).
#include "offload/checkpoint.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include "device/error.hpp"
#include "swap/crc32c.hpp"

namespace spillway::checkpoint {
namespace {

constexpr char magic[8] = {'S', 'P', 'W', 'C', 'K', 'P', 'T', '1'};
constexpr std::uint32_t format_version = 2;  // Note [Checkpoint format]; 1 is read too
constexpr std::uint32_t oldest_format = 1;
constexpr std::size_t header_bytes = 64;
constexpr std::size_t header_crc_span = 36;  // magic, version, 0, index offset, index bytes, index CRC
constexpr std::size_t io_chunk = std::size_t{4} << 20;

std::string errno_text(int err) { return std::generic_category().message(err); }

[[noreturn]] void throw_io(const std::string& what, const std::string& path, int err) {
  throw io_error(what + " '" + path + "': " + errno_text(err), err);
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

/// Reads little-endian fields from a byte string; a read past its end is a damaged index.
class cursor {
 public:
  cursor(std::string_view bytes, const std::string& path) : b_(bytes), path_(path) {}
  std::uint64_t u(int n) {
    need(static_cast<std::size_t>(n));
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(b_[pos_ + i])} << (8 * i);
    pos_ += static_cast<std::size_t>(n);
    return v;
  }
  std::string text(std::uint64_t n) {
    need(n);
    std::string s(b_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  [[nodiscard]] bool done() const noexcept { return pos_ == b_.size(); }

 private:
  void need(std::uint64_t n) const {
    if (n > b_.size() - pos_)
      throw corruption_error("checkpoint '" + path_ + "': its index ends early (its CRC matched: the file was written wrong)");
  }
  std::string_view b_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

void write_all(int fd, const void* data, std::uint64_t bytes, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<std::uint64_t>(bytes, std::uint64_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io("checkpoint: cannot write", path, errno);
    }
    p += n;
    bytes -= static_cast<std::uint64_t>(n);
  }
}

void pread_all(int fd, void* data, std::uint64_t bytes, std::uint64_t offset, const std::string& path) {
  auto* p = static_cast<unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, std::min<std::uint64_t>(bytes, std::uint64_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io("checkpoint: cannot read", path, errno);
    }
    if (n == 0) throw corruption_error("checkpoint '" + path + "' ends early, at " + std::to_string(offset) + " bytes");
    p += n;
    offset += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::uint64_t>(n);
  }
}

/// Appends to the temporary file through a buffer, reporting progress after each write.
class file_writer {
 public:
  file_writer(int fd, std::string path, const write_options& o) : fd_(fd), path_(std::move(path)), o_(o) {
    buf_.reserve(std::size_t{1} << 20);
  }
  void append(const void* data, std::uint64_t bytes) {
    if (buf_.size() + bytes <= buf_.capacity()) {
      buf_.append(static_cast<const char*>(data), bytes);
      return;
    }
    flush();
    if (bytes < buf_.capacity()) {
      buf_.append(static_cast<const char*>(data), bytes);
      return;
    }
    emit(data, bytes);
  }
  void flush() {
    if (buf_.empty()) return;
    emit(buf_.data(), buf_.size());
    buf_.clear();
  }

 private:
  void emit(const void* data, std::uint64_t bytes) {
    write_all(fd_, data, bytes, path_);
    written_ += bytes;
    if (o_.on_progress) o_.on_progress(written_);
  }
  int fd_;
  std::string path_;
  const write_options& o_;
  std::string buf_;
  std::uint64_t written_ = 0;
};

/// Makes `dir` when it is missing (one level); config_error when it cannot be a folder.
void ensure_folder(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw config_error("checkpoint folder '" + dir + "' is a file; give a folder");
    return;
  }
  if (::mkdir(dir.c_str(), 0777) == 0 || errno == EEXIST) return;
  const int err = errno;
  if (err == ENOENT) throw config_error("checkpoint folder '" + dir + "' cannot be made: its parent folder does not exist");
  throw_io("checkpoint: cannot make the folder", dir, err);
}

/// Removes the temporary files of saves whose process is gone (it died mid-save).
void remove_dead_temporaries(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> dead;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name(e->d_name);
    if (!name.starts_with(temp_prefix)) continue;
    const std::string rest(name.substr(temp_prefix.size()));
    const long pid = std::strtol(rest.c_str(), nullptr, 10);
    if (pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) dead.emplace_back(name);
  }
  ::closedir(d);
  for (const auto& name : dead) ::unlink((dir + "/" + name).c_str());  // best effort: another save may race us
}

void sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io("checkpoint: cannot open the folder", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw_io("checkpoint: cannot sync the folder", dir, err);  // EINVAL: no sync there
}

std::string describe(const entry& e) {
  return std::to_string(e.bytes) + " bytes, " + std::string(to_string(e.kind));
}

}  // namespace

void write(const std::string& dir, const std::vector<entry>& entries, const tensor_source& source,
           std::string_view meta, const write_options& options, const session_state& state) {
  {
    std::unordered_set<std::string_view> names;
    for (const auto& e : entries)
      SPILLWAY_EXPECTS_T(usage_error, names.insert(e.name).second, "checkpoint: tensor \"" + e.name + "\" listed twice");
  }
  ensure_folder(dir);
  remove_dead_temporaries(dir);
  static std::atomic<std::uint64_t> serial{0};
  const std::string final_path = dir + "/" + std::string(file_name);
  const std::string temp = dir + "/" + std::string(temp_prefix) + std::to_string(::getpid()) + "." + std::to_string(++serial);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw_io("checkpoint: cannot create", temp, errno);
  bool open = true;
  try {
    file_writer out(fd, temp, options);
    const std::string zeros(header_bytes, '\0');
    out.append(zeros.data(), zeros.size());  // the header, written for real once the index is known
    std::string index;
    put_u64(index, meta.size());
    index.append(meta);
    put_u64(index, entries.size());
    std::uint64_t offset = header_bytes;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      std::uint32_t crc = 0;
      std::uint64_t given = 0;
      source(i, [&](const void* data, std::uint64_t bytes) {
        SPILLWAY_EXPECTS(given + bytes <= e.bytes,
                         "checkpoint: the source gave more than the " + std::to_string(e.bytes) + " bytes of \"" + e.name + "\"");
        crc = crc32c(data, bytes, crc);
        out.append(data, bytes);
        given += bytes;
      });
      SPILLWAY_EXPECTS(given == e.bytes, "checkpoint: the source gave " + std::to_string(given) + " bytes of \"" + e.name +
                                             "\", which has " + std::to_string(e.bytes));
      put_u32(index, static_cast<std::uint32_t>(e.name.size()));
      index.append(e.name);
      const std::string_view kind = to_string(e.kind);
      put_u32(index, static_cast<std::uint32_t>(kind.size()));
      index.append(kind);
      put_u64(index, e.bytes);
      put_u64(index, offset);
      put_u32(index, crc);
      offset += e.bytes;
    }
    put_u64(index, state.iterations);
    out.append(index.data(), index.size());
    out.flush();
    std::string header(magic, sizeof magic);
    put_u32(header, format_version);
    put_u32(header, 0);
    put_u64(header, offset);
    put_u64(header, index.size());
    put_u32(header, crc32c(index.data(), index.size()));
    put_u32(header, crc32c(header.data(), header_crc_span));
    header.resize(header_bytes, '\0');
    if (::pwrite(fd, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size()))
      throw_io("checkpoint: cannot write the header of", temp, errno);
    if (::fsync(fd) != 0) throw_io("checkpoint: cannot sync", temp, errno);
    open = false;
    if (::close(fd) != 0) throw_io("checkpoint: cannot close", temp, errno);
    if (::rename(temp.c_str(), final_path.c_str()) != 0) throw_io("checkpoint: cannot rename into place", final_path, errno);
  } catch (...) {
    if (open) ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  sync_folder(dir);
}

reader::reader(const std::string& dir) : path_(dir + "/" + std::string(file_name)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      throw config_error("no checkpoint in '" + dir + "': '" + path_ + "' does not exist (Session::save writes it)");
    throw_io("checkpoint: cannot open", path_, err);
  }
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_io("checkpoint: cannot stat", path_, errno);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    std::string header(header_bytes, '\0');
    if (size < sizeof magic) throw config_error("'" + path_ + "' is not a Spillway checkpoint (" + std::to_string(size) + " bytes)");
    pread_all(fd_, header.data(), std::min<std::uint64_t>(size, header_bytes), 0, path_);
    if (std::memcmp(header.data(), magic, sizeof magic) != 0)
      throw config_error("'" + path_ + "' is not a Spillway checkpoint (it does not start with \"SPWCKPT1\")");
    if (size < header_bytes) throw corruption_error("checkpoint '" + path_ + "' ends early, inside its header");
    cursor h(std::string_view(header).substr(sizeof magic), path_);
    const auto version = static_cast<std::uint32_t>(h.u(4));
    (void)h.u(4);
    const std::uint64_t index_offset = h.u(8), index_bytes = h.u(8);
    const auto index_crc = static_cast<std::uint32_t>(h.u(4)), header_crc = static_cast<std::uint32_t>(h.u(4));
    if (crc32c(header.data(), header_crc_span) != header_crc)
      throw corruption_error("checkpoint '" + path_ + "': its header fails its CRC; the file is damaged");
    if (version < oldest_format || version > format_version)
      throw config_error("checkpoint '" + path_ + "' has format " + std::to_string(version) + "; this Spillway reads formats " +
                         std::to_string(oldest_format) + " to " + std::to_string(format_version));
    if (index_offset < header_bytes || index_offset > size || index_bytes != size - index_offset)
      throw corruption_error("checkpoint '" + path_ + "' is " + std::to_string(size) + " bytes; its header says " +
                             std::to_string(index_offset + index_bytes) + ": the file was cut or extended");
    std::string index(index_bytes, '\0');
    pread_all(fd_, index.data(), index_bytes, index_offset, path_);
    if (crc32c(index.data(), index.size()) != index_crc)
      throw corruption_error("checkpoint '" + path_ + "': its index fails its CRC; the file is damaged");
    cursor c(index, path_);
    meta_ = c.text(c.u(8));
    const std::uint64_t count = c.u(8);
    for (std::uint64_t i = 0; i < count; ++i) {
      item it;
      it.e.name = c.text(c.u(4));
      const std::string kind = c.text(c.u(4));
      const auto k = parse_tensor_kind(kind);
      if (!k) throw corruption_error("checkpoint '" + path_ + "': tensor \"" + it.e.name + "\" has kind '" + kind + "', which is not a kind");
      it.e.kind = *k;
      it.e.bytes = c.u(8);
      it.offset = c.u(8);
      it.crc = static_cast<std::uint32_t>(c.u(4));
      if (it.offset < header_bytes || it.offset > index_offset || it.e.bytes > index_offset - it.offset)
        throw corruption_error("checkpoint '" + path_ + "': tensor \"" + it.e.name + "\" lies outside the file's data");
      if (!by_name_.emplace(it.e.name, items_.size()).second)
        throw corruption_error("checkpoint '" + path_ + "': tensor \"" + it.e.name + "\" appears twice in its index");
      items_.push_back(std::move(it));
    }
    if (version >= 2) state_ = session_state{c.u(8)};
    if (!c.done()) throw corruption_error("checkpoint '" + path_ + "': its index has bytes after its last tensor");
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

reader::~reader() { ::close(fd_); }

std::vector<entry> reader::entries() const {
  std::vector<entry> v;
  v.reserve(items_.size());
  for (const auto& it : items_) v.push_back(it.e);
  return v;
}

void reader::check_matches(const std::vector<entry>& expected, std::string_view what) const {
  std::unordered_map<std::string_view, const item*> by_name;
  for (const auto& it : items_) by_name.emplace(it.e.name, &it);
  const std::string where = "checkpoint '" + path_ + "'";
  for (const auto& e : expected) {
    const auto f = by_name.find(e.name);
    if (f == by_name.end())
      throw config_error(where + " has no tensor \"" + e.name + "\" (" + describe(e) + "), which " + std::string(what) +
                         " have; it was saved from another model");
    const entry& c = f->second->e;
    if (c.bytes != e.bytes)
      throw config_error(where + ": tensor \"" + e.name + "\" has " + std::to_string(c.bytes) + " bytes there and " +
                         std::to_string(e.bytes) + " in " + std::string(what));
    if (c.kind != e.kind)
      throw config_error(where + ": tensor \"" + e.name + "\" is of kind " + std::string(to_string(c.kind)) +
                         " there and " + std::string(to_string(e.kind)) + " in " + std::string(what));
  }
  std::unordered_set<std::string_view> wanted;
  for (const auto& e : expected) wanted.insert(e.name);
  for (const auto& it : items_) {
    if (!wanted.contains(it.e.name))
      throw config_error(where + " has tensor \"" + it.e.name + "\" (" + describe(it.e) + "), which is not among " +
                         std::string(what) + "; it was saved from another model");
  }
}

const reader::item& reader::find(std::string_view name) const {
  const auto f = by_name_.find(std::string(name));
  if (f != by_name_.end()) return items_[f->second];
  throw usage_error("checkpoint '" + path_ + "' has no tensor \"" + std::string(name) + "\"; call check_matches first");
}

void reader::read_checked(const item& it, void* out) const {
  std::uint32_t crc = 0;
  if (out != nullptr) {
    pread_all(fd_, out, it.e.bytes, it.offset, path_);
    crc = crc32c(out, it.e.bytes);
  } else {
    std::unique_ptr<unsigned char[]> buf(new unsigned char[std::min<std::uint64_t>(io_chunk, std::max<std::uint64_t>(it.e.bytes, 1))]);
    for (std::uint64_t done = 0; done < it.e.bytes;) {
      const std::uint64_t n = std::min<std::uint64_t>(io_chunk, it.e.bytes - done);
      pread_all(fd_, buf.get(), n, it.offset + done, path_);
      crc = crc32c(buf.get(), n, crc);
      done += n;
    }
  }
  if (crc != it.crc) {
    char text[64];
    std::snprintf(text, sizeof text, "stored 0x%08x, read 0x%08x", it.crc, crc);
    throw corruption_error("checkpoint '" + path_ + "': the bytes of tensor \"" + it.e.name + "\" fail their CRC (" +
                           text + "); the file is damaged");
  }
}

void reader::verify() const {
  for (const auto& it : items_) read_checked(it, nullptr);
}

void reader::read(std::string_view name, void* out) const { read_checked(find(name), out); }

}  // namespace spillway::checkpoint
