// spillway-bench nvme: the NVMe tier's write and read GB/s against a plain liburing loop in the
// same run (same directory, block size and queue depth; O_DIRECT and registered buffers where
// the file system and the kernel allow them). Where io_uring is refused, both report why.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <deque>
#include <iomanip>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "allocator/pinned_host_pool.hpp"
#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "examples/common/flags.hpp"
#include "device/device.hpp"
#include "device/error.hpp"
#include "device/huge_pages.hpp"
#include "device/units.hpp"
#include "swap/nvme_tier.hpp"

namespace spillway::bench {
namespace {

using clk = std::chrono::steady_clock;

struct nvme_args {
  examples::config_flags config;  // --config, --backend, --nvme-directories (one; default /tmp)
  std::string size = "256MiB";
  int repeats = 3;
  double target = 0.9;
  std::string json;
};

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }
double gbps(std::size_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0; }
std::string errno_text(int e) { return std::string(std::strerror(e)); }

// ---- the plain loop -----------------------------------------------------------------------

// One file in `dir` (O_TMPFILE, else created and unlinked at once), one ring, one buffer
// registered when the kernel lets it be, `depth` blocks in flight, short transfers and
// -EAGAIN requeued: the loop liburing's examples teach.
class uring_loop {
 public:
  uring_loop(const std::string& dir, std::size_t bytes, std::uint32_t block, unsigned depth)
      : bytes_(bytes), block_(block), depth_(depth) {
    fd_ = open_file(dir);
    if (::fallocate(fd_, 0, 0, static_cast<off_t>(bytes_)) != 0 && errno != EOPNOTSUPP)
      fail("fallocate " + format_bytes(bytes_) + " in " + dir, errno);
    // The buffer on transparent huge pages (2 MiB aligned, advised before it is touched), as
    // the tier's are: with 4 KiB pages every 1 MiB I/O is 256 segments, which a virtual disk
    // splits into several requests, and the baseline would be one nobody should write.
    map_bytes_ = bytes_ + huge;
    void* m = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("mmap", errno);
    map_ = m;
    buf_ = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(m) + huge - 1) & ~(huge - 1));
    ::madvise(buf_, bytes_, MADV_HUGEPAGE);  // advice: where it is refused, 4 KiB pages
    std::memset(buf_, 0x5A, bytes_);
    huge_bytes_ = detail::huge_page_backed_bytes(buf_, bytes_);  // measured, for the report
    const int rc = io_uring_queue_init(depth_, &ring_, 0);
    if (rc < 0) fail("io_uring_queue_init", -rc);
    have_ring_ = true;
    // Registered buffers of at most 256 MiB each (the kernel caps one at 1 GiB).
    for (std::size_t off = 0; off < bytes_; off += chunk)
      iovs_.push_back({static_cast<char*>(buf_) + off, std::min(chunk, bytes_ - off)});
    fixed_ = io_uring_register_buffers(&ring_, iovs_.data(), static_cast<unsigned>(iovs_.size())) == 0;
  }
  ~uring_loop() {
    if (have_ring_) io_uring_queue_exit(&ring_);
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    if (fd_ >= 0) ::close(fd_);
  }
  uring_loop(const uring_loop&) = delete;
  uring_loop& operator=(const uring_loop&) = delete;

  double write_seconds() { return pass(true); }
  double read_seconds() { return pass(false); }
  [[nodiscard]] bool direct() const noexcept { return direct_; }
  [[nodiscard]] bool fixed() const noexcept { return fixed_; }
  [[nodiscard]] std::size_t huge_page_bytes() const noexcept { return huge_bytes_; }

 private:
  static constexpr std::size_t chunk = std::size_t{256} << 20;
  static constexpr std::size_t huge = std::size_t{2} << 20;

  [[noreturn]] static void fail(const std::string& what, int e) { throw io_error("plain loop: " + what + ": " + errno_text(e), e); }

  int open_file(const std::string& dir) {
    for (const int direct : {O_DIRECT, 0}) {
      int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | direct, 0600);
      if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == ENOENT)) {
        std::string path = dir + "/spillway-plain-XXXXXX";
        fd = ::mkostemp(path.data(), direct);
        if (fd >= 0) ::unlink(path.c_str());
      }
      if (fd >= 0) {
        direct_ = direct != 0;
        return fd;
      }
      if (errno != EINVAL) fail("cannot open a file in '" + dir + "'", errno);
    }
    fail("cannot open a file in '" + dir + "'", EINVAL);
  }

  double pass(bool write) {
    const std::size_t blocks = (bytes_ + block_ - 1) / block_;
    std::vector<std::size_t> done_bytes(blocks, 0);
    std::deque<std::size_t> pending;
    for (std::size_t b = 0; b < blocks; ++b) pending.push_back(b);
    std::size_t finished = 0;
    unsigned inflight = 0;
    const auto t0 = clk::now();
    while (finished < blocks) {
      while (inflight < depth_ && !pending.empty()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) break;
        const std::size_t b = pending.front();
        pending.pop_front();
        const std::size_t off = b * block_ + done_bytes[b];
        const auto len = static_cast<unsigned>(std::min<std::size_t>(block_, bytes_ - b * block_) - done_bytes[b]);
        char* p = static_cast<char*>(buf_) + off;
        if (fixed_) {
          const int index = static_cast<int>(off / chunk);
          if (write) io_uring_prep_write_fixed(sqe, fd_, p, len, off, index);
          else io_uring_prep_read_fixed(sqe, fd_, p, len, off, index);
        } else if (write) {
          io_uring_prep_write(sqe, fd_, p, len, off);
        } else {
          io_uring_prep_read(sqe, fd_, p, len, off);
        }
        io_uring_sqe_set_data64(sqe, b);
        ++inflight;
      }
      const int sub = io_uring_submit(&ring_);
      if (sub < 0 && sub != -EAGAIN && sub != -EINTR) fail("io_uring_submit", -sub);
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) fail("io_uring_wait_cqe", -rc);
      while (cqe != nullptr) {
        const std::size_t b = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        --inflight;
        const std::size_t want = std::min<std::size_t>(block_, bytes_ - b * block_);
        if (res == -EAGAIN || res == -EINTR) {
          pending.push_back(b);
        } else if (res < 0) {
          fail(write ? "write" : "read", -res);
        } else if (res == 0) {
          fail(write ? "write made no progress" : "read past the end of the file", EIO);
        } else {
          done_bytes[b] += static_cast<std::size_t>(res);
          if (done_bytes[b] < want) pending.push_back(b);  // short transfer: the rest again
          else ++finished;
        }
        cqe = nullptr;
        if (io_uring_peek_cqe(&ring_, &cqe) != 0) cqe = nullptr;
      }
    }
    return seconds_since(t0);
  }

  std::size_t bytes_;
  std::uint32_t block_;
  unsigned depth_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  void* buf_ = nullptr;
  std::size_t huge_bytes_ = 0;
  io_uring ring_{};
  bool have_ring_ = false;
  bool fixed_ = false;
  bool direct_ = false;
  std::vector<iovec> iovs_;
};

// ---- the command --------------------------------------------------------------------------

int run(const nvme_args& a) {
  check_outputs({{"--json", a.json}}, {{"--config", a.config.config_file}});
  const std::size_t n = parse_size(a.size, "--size");
  session_config c = examples::load_config(a.config);
  if (c.nvme.directories.empty()) c.nvme.directories = {"/tmp"};
  c.validate();
  if (c.nvme.directories.size() != 1)
    throw config_error(c.source_of("nvme.directories") + ": nvme compares one drive with a plain loop; give one directory");
  const std::string dir = c.nvme.directories.front();
  const auto bs = static_cast<std::uint32_t>(c.nvme.block_size);  // both sides use the tier's block and depth
  const auto depth = static_cast<unsigned>(c.nvme.queue_depth);
  if (n % bs != 0)
    throw config_error("--size: " + a.size + " is not a multiple of " + c.source_of("nvme.block_size") + " " + format_bytes(bs));
  device_options dopt;
  dopt.cpu_device_memory = c.cpu_device_memory != 0 ? c.cpu_device_memory : std::size_t{64} << 20;
  dopt.strict.callback_seed = c.cpu_callback_seed;
  auto dev = make_device(c.backend, dopt);

  nlohmann::json j = {{"device", dev->properties().name}, {"backend", to_string(dev->properties().backend)},
                      {"dir", dir}, {"bytes", n}, {"block_size", bs}, {"queue_depth", depth},
                      {"repeats", a.repeats}, {"target", a.target}, {"skipped", false}};
  auto finish = [&](int code) {
    if (!a.json.empty()) {
      write_output(a.json, j.dump(2) + "\n", "--json");
    }
    return code;
  };

  // Spillway's side: the tier over a buffer of its own pinned pool, as the executor uses it.
  std::optional<pinned_host_pool> pool;
  std::optional<nvme_tier> tier;
  std::optional<uring_loop> plain;
  void* buf = nullptr;
  try {
    pool.emplace(*dev, pinned_pool_options{.capacity = 0, .region_size = std::min<std::size_t>(n, std::size_t{1} << 30),
                                           .alignment = 4096});
    buf = pool->allocate(n);
    std::memset(buf, 0x5A, n);
    nvme_options o;
    o.directories = {dir};
    o.reserve = n + bs;
    o.block_size = bs;
    o.queue_depth = depth;
    tier.emplace(o, &*pool);
    plain.emplace(dir, n, bs, depth);
  } catch (const io_error& e) {
    // io_uring refused (a sandbox), or no O_DIRECT-capable place: a reason, not a failure.
    std::cout << "SKIP nvme tier vs plain liburing loop: " << e.what() << "\n";
    j["skipped"] = true;
    j["reason"] = e.what();
    if (buf != nullptr) pool->deallocate(buf, n);
    return finish(0);
  }

  // Turns: the tier's write, the plain write, the tier's read, the plain read; best of each.
  double tw = 1e30, tr = 1e30, pw = 1e30, pr = 1e30;
  for (int r = 0; r < a.repeats; ++r) {
    auto t0 = clk::now();
    tier->write("bench", buf, n, n).wait();
    tw = std::min(tw, seconds_since(t0));
    pw = std::min(pw, plain->write_seconds());
    t0 = clk::now();
    tier->read("bench", buf, n).wait();
    tr = std::min(tr, seconds_since(t0));
    pr = std::min(pr, plain->read_seconds());
    tier->erase("bench");
  }
  const auto stats = tier->stats();
  const double w = gbps(n, tw), rd = gbps(n, tr), p_w = gbps(n, pw), p_r = gbps(n, pr);
  const bool met = w >= a.target * p_w && rd >= a.target * p_r;
  std::cout << std::fixed << std::setprecision(2) << "nvme tier in " << dir << ": " << format_bytes(n) << ", block "
            << format_bytes(bs) << ", depth " << depth << ", best of " << a.repeats << "\n"
            << "  spillway write " << w << " GB/s, read " << rd << " GB/s (" << (tier->direct_io() ? "O_DIRECT" : "buffered")
            << ", " << stats.fixed_buffer_ops << "/" << stats.ops << " ops on fixed buffers, CRC32C per block)\n"
            << "  plain    write " << p_w << " GB/s, read " << p_r << " GB/s (" << (plain->direct() ? "O_DIRECT" : "buffered")
            << (plain->fixed() ? ", registered buffer" : ", unregistered buffer") << ", "
            << format_bytes(plain->huge_page_bytes()) << " on huge pages)\n"
            << "  ratio    write " << w / p_w << "x, read " << rd / p_r << "x\n"
            << "target: both at least " << a.target << "x the plain loop: " << (met ? "PASS" : "MISS") << "\n";
  j["write_gbps"] = w;
  j["read_gbps"] = rd;
  j["plain_write_gbps"] = p_w;
  j["plain_read_gbps"] = p_r;
  j["direct_io"] = tier->direct_io();
  j["plain_direct_io"] = plain->direct();
  j["plain_fixed_buffers"] = plain->fixed();
  j["plain_huge_page_bytes"] = plain->huge_page_bytes();
  j["huge_page_bytes"] = stats.huge_page_bytes;
  j["fixed_buffer_ops"] = stats.fixed_buffer_ops;
  j["ops"] = stats.ops;
  j["target_met"] = met;
  tier.reset();
  pool->deallocate(buf, n);
  return finish(met ? 0 : 1);
}

const command_registration registration{"nvme", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<nvme_args>();
  auto* cmd = app.add_subcommand("nvme", "NVMe tier write/read against a plain liburing loop, same run");
  examples::add_config_flags(*cmd, args->config, {"backend", "cpu_device_memory", "cpu_callback_seed", "nvme.directories",
                                                 "nvme.block_size", "nvme.queue_depth"});
  cmd->add_option("--size", args->size, "bytes per pass")->capture_default_str();
  cmd->add_option("--repeats", args->repeats, "passes per side (best taken)")->capture_default_str()->check(whole_number_in(1, 1000));
  cmd->add_option("--target", args->target, "least ratio to the plain loop")->capture_default_str()->check(positive_number);
  cmd->add_option("--json", args->json, "write the figures as JSON")->check(writable_file);
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}};

}  // namespace
}  // namespace spillway::bench
