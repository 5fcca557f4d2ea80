// NVMe tier: swap files, block placement over extents, and the transfer that moves one
// tensor as blocks through the rings with a CRC32C per block. See Note [I/O seam].
#include "swap/nvme_tier.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "device/error.hpp"
#include "device/units.hpp"
#include "swap/crc32c.hpp"
#include "swap/io_ring.hpp"
#include "swap/thread_queue.hpp"

namespace spillway {

// Note [I/O seam]
// Every read and write the tier makes goes through an io_queue (swap/io_queue.hpp), one per
// ring, made by options.make_queue. Production uses liburing; tests wrap the real queue and
// change results on the way back (EIO on the k-th op, short transfers, -EAGAIN, ENOSPC) or
// corrupt a block on disk after it was written. The tier itself never looks past the queue,
// so what the tests inject is exactly what a drive or kernel could report.

namespace {

struct free_deleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

std::string hex(std::uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

}  // namespace

namespace detail {

/// One tensor's read or write: its blocks, its buffers, its first error.
class nvme_transfer final : public block_owner {
 public:
  nvme_transfer(nvme_tier& tier, io_kind kind, std::string name, nvme_tier::record& rec, char* user,
                std::size_t capacity, nvme_tier::completion on_done)
      : tier_(tier), kind_(kind), name_(std::move(name)), rec_(rec), user_(user), on_done_(std::move(on_done)),
        state_(std::make_shared<move_state>()) {
    const std::size_t bs = tier.options_.block_size;
    const std::size_t align = tier.alignment_;
    const std::size_t n = rec.blocks.size();
    if (n > 0) {
      const std::size_t last_len = rec.bytes - (n - 1) * bs;
      const std::size_t need = (n - 1) * bs + round_up(last_len, align);
      const bool aligned = reinterpret_cast<std::uintptr_t>(user) % align == 0;
      if (!aligned) {
        bounce_.reset(std::aligned_alloc(align, need));
        whole_ = true;
      } else if (std::max(capacity, rec.bytes) < need) {
        bounce_.reset(std::aligned_alloc(align, round_up(last_len, align)));
        tail_ = true;
      }
      if ((whole_ || tail_) && bounce_ == nullptr)
        throw out_of_memory("nvme tier: no memory for a bounce buffer for tensor '" + name_ + "'");
    }
    blocks_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto& b = blocks_[i];
      b.kind = kind;
      b.fd = tier.files_[rec.blocks[i].file].fd();
      b.buffer = io_buffer(i);
      b.length = static_cast<std::uint32_t>(round_up(logical_length(i), align));
      b.offset = rec.blocks[i].offset;
      b.owner = this;
      b.index = static_cast<std::uint32_t>(i);
    }
    user_bytes_ = rec.bytes;
    unsettled_.store(n);
    parts_.store(n + 1);
  }

  void prepare(block_io& b) noexcept override {
    if (kind_ != io_kind::write) return;
    const std::size_t i = b.index;
    const std::size_t len = logical_length(i);
    const char* src = user_ + i * tier_.options_.block_size;
    auto* io = static_cast<char*>(b.buffer);
    if (io != src) {  // bounced: copy in and zero the padding, never write stray memory
      std::memcpy(io, src, len);
      std::memset(io + len, 0, b.length - len);
    }
  }

  void complete(block_io& b, int result) noexcept override {
    const std::size_t i = b.index;
    if (b.abandoned) {  // its move failed already; the kernel is done with its buffer only now
      drop_part();
      return;
    }
    if (result < 0) {
      fail(std::make_exception_ptr(io_error(describe(i, kind_ == io_kind::write ? "write" : "read") + ": " +
                                                std::strerror(-result),
                                            -result)));
    } else if (kind_ == io_kind::write) {
      // The source may not change until the move is done, so its CRC is the CRC of what was
      // written; computing it here keeps it off the submission path (Note [Keeping the queue full]).
      rec_.crc[i] = crc32c(user_ + i * tier_.options_.block_size, logical_length(i));
    } else {
      const std::size_t len = logical_length(i);
      char* dst = user_ + i * tier_.options_.block_size;
      const char* io = io_buffer(i);
      if (io != dst) std::memcpy(dst, io, len);
      const std::uint32_t got = crc32c(dst, len);
      if (got != rec_.crc[i])
        fail(std::make_exception_ptr(corruption_error(describe(i, "read") + ": checksum mismatch (CRC32C expected " +
                                                      hex(rec_.crc[i]) + ", got " + hex(got) + ")")));
    }
    settle();
    drop_part();
  }

  void abandon(block_io& b, std::chrono::milliseconds after) noexcept override {
    abandoned_.fetch_add(1, std::memory_order_relaxed);
    fail(std::make_exception_ptr(io_error(describe(b.index, kind_ == io_kind::write ? "write" : "read") +
                                              ": no completion after " + std::to_string(after.count()) +
                                              " ms; the request was cancelled",
                                          ETIMEDOUT)));
    settle();
  }

  /// Runs when every block is done or abandoned (or at once when there are none): the move is
  /// over. The transfer itself lives on until every block has come back (retire).
  void finish() noexcept {
    if (kind_ == io_kind::write && !tier_.direct_ && !has_abandoned()) flush_buffered();
    std::exception_ptr e;
    {
      std::lock_guard lock(error_mutex_);
      e = std::exchange(error_, nullptr);  // this thread may outlive the caller's hold on it
    }
    tier_.finished(this, std::move(e));
    drop_part();
  }

  /// True when some block was abandoned: the kernel may still use its buffer and file blocks.
  [[nodiscard]] bool has_abandoned() const noexcept { return abandoned_.load(std::memory_order_relaxed) > 0; }
  /// True when `p` lies in the caller's buffer of this move.
  [[nodiscard]] bool uses(const void* p) const noexcept {
    const auto* c = static_cast<const char*>(p);
    return c >= user_ && c < user_ + std::max<std::size_t>(user_bytes_, 1);
  }
  /// Extents of a failed write, held out of the allocator until retire.
  std::vector<std::pair<std::uint32_t, extent>> held_extents;
  /// after_settled callbacks waiting for this move's abandoned blocks.
  std::vector<std::function<void()>> deferred;

  [[nodiscard]] io_kind kind() const noexcept { return kind_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] nvme_tier::record& rec() noexcept { return rec_; }
  [[nodiscard]] std::vector<block_io>& blocks() noexcept { return blocks_; }
  [[nodiscard]] nvme_tier::completion& on_done() noexcept { return on_done_; }
  [[nodiscard]] const std::shared_ptr<move_state>& state() const noexcept { return state_; }

 private:
  [[nodiscard]] std::size_t logical_length(std::size_t i) const noexcept {
    const std::size_t bs = tier_.options_.block_size;
    return std::min(bs, rec_.bytes - i * bs);
  }
  [[nodiscard]] char* io_buffer(std::size_t i) const noexcept {
    const std::size_t bs = tier_.options_.block_size;
    auto* bounce = static_cast<char*>(bounce_.get());
    if (whole_) return bounce + i * bs;
    if (tail_ && i + 1 == blocks_.size()) return bounce;
    return user_ + i * bs;
  }
  [[nodiscard]] std::string describe(std::size_t i, const char* what) const {
    const auto& p = rec_.blocks[i];
    return "nvme tier: " + std::string(what) + " of tensor '" + name_ + "' failed at offset " +
           std::to_string(i * tier_.options_.block_size) + " (block " + std::to_string(i) + " of " +
           std::to_string(rec_.blocks.size()) + ", swap file in '" + tier_.files_[p.file].directory() +
           "' at offset " + std::to_string(p.offset) + ")";
  }
  void fail(std::exception_ptr e) noexcept {
    std::lock_guard lock(error_mutex_);
    if (!error_) error_ = std::move(e);
  }
  // Note [Buffered writes and a full disk]
  // With O_DIRECT a full disk (or a failing drive) answers the write itself with -ENOSPC/-EIO.
  // A buffered write (a file system that refuses O_DIRECT) only fills the page cache: the error
  // comes at writeback, the block on disk keeps old bytes, and the tensor would be stored with a
  // CRC of bytes that never reached the disk: a "checksum mismatch" on some later read, long
  // after the cause. So a buffered write is flushed (fdatasync, which reports writeback errors)
  // before it counts as stored, and a failure there fails the write, naming the directory.
  void flush_buffered() noexcept {
    std::vector<std::uint32_t> files;
    for (const auto& p : rec_.blocks)
      if (std::find(files.begin(), files.end(), p.file) == files.end()) files.push_back(p.file);
    for (const auto f : files) {
      if (::fdatasync(tier_.files_[f].fd()) == 0) continue;
      const int err = errno;
      fail(std::make_exception_ptr(io_error("nvme tier: write of tensor '" + name_ + "' to the swap file in '" +
                                                tier_.files_[f].directory() + "' failed when flushed: " +
                                                std::strerror(err),
                                            err)));
    }
  }
  void settle() noexcept {
    if (unsettled_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
  }
  void drop_part() noexcept {
    if (parts_.fetch_sub(1, std::memory_order_acq_rel) == 1) tier_.retire(this);
  }

  nvme_tier& tier_;
  io_kind kind_;
  std::string name_;
  nvme_tier::record& rec_;
  char* user_;
  std::unique_ptr<void, free_deleter> bounce_;
  bool whole_ = false;
  bool tail_ = false;
  std::vector<block_io> blocks_;
  std::size_t user_bytes_ = 0;
  std::atomic<std::size_t> unsettled_{0};  // blocks neither complete nor abandoned
  std::atomic<std::size_t> parts_{0};      // blocks not come back, plus one for finish()
  std::atomic<std::size_t> abandoned_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;
  nvme_tier::completion on_done_;
  std::shared_ptr<move_state> state_;
};

}  // namespace detail

nvme_tier::nvme_tier(nvme_options options, pinned_host_pool* pool)
    : options_(std::move(options)), pool_(pool), counters_(std::make_unique<detail::ring_counters>()) {
  // Bad options are the caller's input (session_config's nvme.* settings): config_errors that
  // name the option and carry no source location (device/error.hpp).
  if (options_.directories.empty()) throw config_error("nvme tier: nvme.directories is empty; give at least one swap directory");
  if (options_.block_size < 512 || options_.block_size > (1u << 30))
    throw config_error("nvme tier: nvme.block_size " + std::to_string(options_.block_size) + " is not between 512 B and 1 GiB");
  if (options_.queue_depth < 1 || options_.queue_depth > 4096)
    throw config_error("nvme tier: nvme.queue_depth " + std::to_string(options_.queue_depth) + " is not between 1 and 4096");
  if (options_.io_timeout.count() < 0)
    throw config_error("nvme tier: nvme.io_timeout_ms " + std::to_string(options_.io_timeout.count()) +
                       " is negative; give milliseconds, or 0 to wait for ever");
  if (options_.rings < 1 || options_.rings > 64)
    throw config_error("nvme tier: nvme.rings " + std::to_string(options_.rings) + " is not between 1 and 64");
  const std::size_t nfiles = options_.directories.size();
  const std::uint64_t per_file =
      round_up((options_.reserve + nfiles - 1) / nfiles, options_.block_size);
  for (const auto& dir : options_.directories) {
    files_.push_back(open_swap_file(dir, per_file, options_.open_file));
    alignment_ = std::max(alignment_, files_.back().alignment());
    direct_ = direct_ && files_.back().direct();
    space_.emplace_back(per_file / options_.block_size);
  }
  if (options_.block_size % alignment_ != 0)
    throw config_error("nvme tier: nvme.block_size " + std::to_string(options_.block_size) +
                       " is not a multiple of the swap files' O_DIRECT alignment " + std::to_string(alignment_));
  // Without a queue of the caller's, io_uring; where the kernel refuses it (a container's seccomp
  // profile, a kernel without it), pread/pwrite threads, with a warning: slower, never a failure.
  std::function<std::unique_ptr<io_queue>(unsigned)> make = options_.make_queue;
  if (!make) {
    make = [this](unsigned d) { return make_queue_or_threads(d, make_uring_queue, io_uring_); };
  }
  // Every ring registers the same regions; only the first measures them for huge_page_bytes,
  // so each region counts once (Note [Counting huge-page bytes] in io_ring.cpp).
  for (unsigned r = 0; r < options_.rings; ++r)
    rings_.push_back(std::make_unique<detail::io_ring>(make(options_.queue_depth), pool_, *counters_, options_.max_retries,
                                                          options_.huge_pages && r == 0, options_.io_timeout));
}

nvme_tier::~nvme_tier() {
  {
    std::unique_lock lock(mutex_);
    idle_cv_.wait(lock, [this] { return in_flight_ == 0; });
  }
  rings_.clear();
  files_.clear();
}

void nvme_tier::place(record& r, const std::string& name) {
  const std::size_t bs = options_.block_size;
  const std::size_t n = (r.bytes + bs - 1) / bs;
  const auto nf = static_cast<std::uint32_t>(files_.size());
  const std::uint32_t start = next_start_file_++ % nf;
  // The block list is made once every file has given its blocks: a tensor far larger than the
  // tier (a petabyte) is refused as out of swap space without a list of a billion entries first.
  for (std::uint32_t f = 0; f < nf; ++f) {
    const std::uint32_t first = (f + nf - start) % nf;  // first tensor block that lands on file f
    const std::uint64_t count = first < n ? (n - first + nf - 1) / nf : 0;
    if (count == 0) continue;
    auto got = space_[f].allocate(count);
    if (got.empty() && options_.grow_on_demand) {
      // Grow every file by what this one lacks, at least doubling, else exactly what is missing.
      const std::uint64_t have = space_[f].total_blocks() * bs;
      const std::uint64_t need = have + (count - space_[f].free_blocks()) * bs;
      try {
        try {
          grow_files(std::max(need, 2 * have));
        } catch (const out_of_memory&) {
          try {
            grow_files(need);
          } catch (const out_of_memory&) {  // NOLINT(bugprone-empty-catch): reported below as out of swap space
          }
        }
      } catch (...) {
        release(r);  // the blocks taken in the files before this one go back
        throw;
      }
      got = space_[f].allocate(count);
    }
    if (got.empty()) {
      release(r);
      std::string per_file;
      for (std::uint32_t g = 0; g < nf; ++g)
        per_file += (g != 0 ? ", " : "") + std::string("'") + files_[g].directory() + "': " +
                    format_bytes(space_[g].free_blocks() * bs) + " free, largest run " +
                    format_bytes(space_[g].largest_free_extent() * bs);
      const auto st_free = [&] {
        std::uint64_t s = 0;
        for (const auto& a : space_) s += a.free_blocks() * bs;
        return s;
      }();
      const std::uint64_t capacity = space_.size() * space_[0].total_blocks() * bs;
      throw out_of_memory("nvme tier: out of swap space for tensor '" + name + "' (" + format_bytes(r.bytes) + ", " +
                          std::to_string(n) + " blocks of " + format_bytes(bs) + "): capacity " +
                          format_bytes(capacity) + ", in use " + format_bytes(capacity - st_free) + " (whole blocks) for " +
                          format_bytes(stored_bytes_) + " of tensors, free " + format_bytes(st_free) + " (" +
                          per_file + "); " +
                          (options_.grow_on_demand
                               ? "the swap directories' file systems have no room to grow it: free space there, add a "
                                 "directory on another drive, or give a block size nearer the tensors' sizes"
                               : "give a larger reserve, a block size nearer the tensors' sizes, or grow_on_demand"));
    }
    for (const auto& e : got) r.extents.emplace_back(f, e);
  }
  r.blocks.resize(n);
  r.crc.assign(n, 0);
  std::vector<std::uint64_t> next(nf, 0);  // per file: its blocks placed so far
  for (const auto& [f, e] : r.extents) {
    const std::uint32_t first = (f + nf - start) % nf;
    for (std::uint64_t k = 0; k < e.count; ++k, ++next[f]) r.blocks[first + next[f] * nf] = {f, (e.first + k) * bs};
  }
}

void nvme_tier::grow_files(std::uint64_t per_file) {
  per_file = round_up(per_file, options_.block_size);
  for (std::size_t f = 0; f < files_.size(); ++f) {
    const std::uint64_t had = files_[f].bytes();
    if (per_file <= had) continue;
    files_[f].grow(per_file);
    space_[f].grow((per_file - had) / options_.block_size);
  }
}

void nvme_tier::reserve(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  grow_files((bytes + files_.size() - 1) / files_.size());
}

std::uint64_t nvme_tier::reservable_bytes() const {
  std::lock_guard lock(mutex_);
  std::uint64_t least = ~std::uint64_t{0};
  for (const auto& f : files_) {
    std::size_t sharing = 0;
    for (const auto& g : files_) sharing += g.file_system() == f.file_system() ? 1 : 0;
    const std::uint64_t could = f.bytes() + f.free_space() / sharing / options_.block_size * options_.block_size;
    least = std::min(least, could);
  }
  return least * files_.size();
}

void nvme_tier::release(record& r) {
  for (const auto& [f, e] : r.extents) space_[f].deallocate(e);
  r.extents.clear();
}

move_handle nvme_tier::start(std::unique_ptr<detail::nvme_transfer> t) {
  auto* raw = t.release();
  move_handle handle(raw->state());
  auto& blocks = raw->blocks();
  if (blocks.empty()) {
    raw->finish();
    return handle;
  }
  std::vector<std::vector<detail::block_io*>> per_ring(rings_.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) per_ring[i % rings_.size()].push_back(&blocks[i]);
  for (std::size_t r = 0; r < rings_.size(); ++r) rings_[r]->post(per_ring[r]);
  return handle;
}

move_handle nvme_tier::write(const std::string& name, const void* src, std::size_t bytes, std::size_t src_capacity,
                             completion on_done) {
  SPILLWAY_EXPECTS_T(usage_error, src != nullptr || bytes == 0, "nvme tier: write of tensor '" + name + "' from a null buffer");
  record* rec = nullptr;
  {
    std::lock_guard lock(mutex_);
    SPILLWAY_EXPECTS_T(usage_error, tensors_.find(name) == tensors_.end(), "nvme tier: tensor '" + name + "' is already stored");
    auto r = std::make_unique<record>();
    r->bytes = bytes;
    place(*r, name);
    rec = r.get();
    tensors_.emplace(name, std::move(r));
    ++in_flight_;
  }
  std::unique_ptr<detail::nvme_transfer> t;
  try {
    t = std::make_unique<detail::nvme_transfer>(*this, io_kind::write, name, *rec,
                                                const_cast<char*>(static_cast<const char*>(src)), src_capacity,
                                                std::move(on_done));
  } catch (...) {
    std::lock_guard lock(mutex_);
    release(*rec);
    tensors_.erase(name);
    --in_flight_;
    idle_cv_.notify_all();
    throw;
  }
  return start(std::move(t));
}

move_handle nvme_tier::read(const std::string& name, void* dst, std::size_t dst_capacity, completion on_done) {
  record* rec = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto it = tensors_.find(name);
    SPILLWAY_EXPECTS_T(usage_error, it != tensors_.end(), "nvme tier: tensor '" + name + "' is not stored");
    SPILLWAY_EXPECTS_T(usage_error, !it->second->writing, "nvme tier: tensor '" + name + "' is still being written");
    SPILLWAY_EXPECTS_T(usage_error, dst != nullptr || it->second->bytes == 0, "nvme tier: read of tensor '" + name + "' into a null buffer");
    rec = it->second.get();
    ++rec->readers;
    ++in_flight_;
  }
  std::unique_ptr<detail::nvme_transfer> t;
  try {
    t = std::make_unique<detail::nvme_transfer>(*this, io_kind::read, name, *rec, static_cast<char*>(dst),
                                                dst_capacity, std::move(on_done));
  } catch (...) {
    std::lock_guard lock(mutex_);
    --rec->readers;
    --in_flight_;
    idle_cv_.notify_all();
    throw;
  }
  return start(std::move(t));
}

void nvme_tier::finished(detail::nvme_transfer* t, std::exception_ptr error) noexcept {
  {
    std::lock_guard lock(mutex_);
    auto& rec = t->rec();
    if (t->has_abandoned()) abandoned_.push_back(t);  // before on_done, which may call after_settled
    if (t->kind() == io_kind::write) {
      if (error) {
        if (t->has_abandoned())  // the kernel may still write there: out of use until retire
          t->held_extents = std::move(rec.extents);
        else
          release(rec);
        tensors_.erase(t->name());  // rec is gone from here on
        ++failed_moves_;
      } else {
        rec.writing = false;
        stored_bytes_ += rec.bytes;
        bytes_written_ += rec.bytes;
      }
    } else {
      --rec.readers;
      if (error)
        ++failed_moves_;
      else
        bytes_read_ += rec.bytes;
    }
  }
  if (t->on_done()) {
    try {
      t->on_done()(detail::copy_error(error));  // Note [Errors that cross threads]
    } catch (...) {  // a completion must not throw; the move's own result still stands
    }
    t->on_done() = nullptr;  // what it holds goes now, not when the last block comes back
  }
  t->state()->finish(std::move(error));
  std::lock_guard lock(mutex_);
  --in_flight_;
  idle_cv_.notify_all();
}

void nvme_tier::retire(detail::nvme_transfer* t) noexcept {
  std::unique_ptr<detail::nvme_transfer> owned(t);
  std::vector<std::function<void()>> deferred;
  {
    std::lock_guard lock(mutex_);
    if (auto it = std::find(abandoned_.begin(), abandoned_.end(), t); it != abandoned_.end()) abandoned_.erase(it);
    for (const auto& [f, e] : t->held_extents) space_[f].deallocate(e);
    deferred = std::move(t->deferred);
  }
  owned.reset();
  for (auto& release : deferred) {
    try {
      release();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a release must not throw; nothing to undo
    }
  }
}

void nvme_tier::after_settled(const void* buffer, std::function<void()> release) {
  {
    std::lock_guard lock(mutex_);
    for (auto* t : abandoned_) {
      if (t->uses(buffer)) {
        t->deferred.push_back(std::move(release));
        return;
      }
    }
  }
  release();
}

void nvme_tier::erase(const std::string& name) {
  std::lock_guard lock(mutex_);
  auto it = tensors_.find(name);
  SPILLWAY_EXPECTS_T(usage_error, it != tensors_.end(), "nvme tier: tensor '" + name + "' is not stored");
  SPILLWAY_EXPECTS_T(usage_error, !it->second->writing && it->second->readers == 0,
                   "nvme tier: tensor '" + name + "' cannot be erased while it is being written or read");
  release(*it->second);
  stored_bytes_ -= it->second->bytes;
  tensors_.erase(it);
}

bool nvme_tier::contains(const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto it = tensors_.find(name);
  return it != tensors_.end() && !it->second->writing;
}

std::size_t nvme_tier::size(const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto it = tensors_.find(name);
  SPILLWAY_EXPECTS_T(usage_error, it != tensors_.end(), "nvme tier: tensor '" + name + "' is not stored");
  return it->second->bytes;
}

nvme_stats nvme_tier::stats() const {
  nvme_stats s;
  // The count of abandoned blocks first: it falls only after their late completion has given
  // their file blocks back (io_ring::run), so free_bytes read after it counts them whenever
  // the count does not. Read the other way round, a completion between the two reads gives a
  // count of 0 beside free bytes that still lack those blocks.
  s.abandoned_ios = counters_->abandoned.load(std::memory_order_acquire);
  {
    std::lock_guard lock(mutex_);
    for (const auto& a : space_) {
      s.capacity_bytes += a.total_blocks() * options_.block_size;
      s.free_bytes += a.free_blocks() * options_.block_size;
      s.free_bytes_per_file.push_back(a.free_blocks() * options_.block_size);
    }
    s.stored_bytes = stored_bytes_;
    s.tensors = tensors_.size();
    s.bytes_written = bytes_written_;
    s.bytes_read = bytes_read_;
    s.io_uring = io_uring_;
    s.failed_moves = failed_moves_;
  }
  s.ops = counters_->ops.load(std::memory_order_relaxed);
  s.fixed_buffer_ops = counters_->fixed_ops.load(std::memory_order_relaxed);
  s.eagain_retries = counters_->eagain_retries.load(std::memory_order_relaxed);
  s.short_transfers = counters_->short_transfers.load(std::memory_order_relaxed);
  s.huge_page_bytes = counters_->huge_page_bytes.load(std::memory_order_relaxed);
  s.region_pins = counters_->region_pins.load(std::memory_order_relaxed);
  s.timed_out_ios = counters_->timed_out.load(std::memory_order_relaxed);
  return s;
}

}  // namespace spillway
