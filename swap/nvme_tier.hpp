// NVMe tier: tensor bytes in swap files on one or more drives, moved by io_uring in blocks,
// striped over the files, each block checked by CRC32C on every read.
//
// Glossary. A *block* is the unit of I/O and of placement (block_size bytes; a tensor's last
// block may be partial). An *extent* is a run of blocks in one swap file. A tensor's blocks go
// round-robin over the swap files (block i to file (start + i) mod files), so a tensor moves at
// the speed of all drives together.
//
// Guarantees:
//  * Space is reserved when the tier is made (fallocate): a directory that is missing, not
//    writable or too small is an error then, before any tensor is written. reserve() grows it
//    later (the Session does, once a plan says what goes to NVMe); growing never moves a block.
//  * write() keeps nothing on failure: the tensor is not stored and its extents are free.
//  * read() verifies every block's CRC32C; a mismatch fails the read with corruption_error
//    naming the tensor and the offset. A failed read leaves the tensor stored.
//  * Errors reach the handle (and on_done), never the I/O thread; the tier keeps working.
//  * A block whose completion does not come within io_timeout fails its move with an io_error
//    (ETIMEDOUT) naming the tensor and the swap directory; the request is cancelled, and its
//    place in the file (and the tier's own buffers) stay out of use until the kernel is really
//    done with it (Note [Hung completions] in io_ring.cpp). The caller's buffer of such a move
//    may be touched by the kernel until then too: free it through after_settled().
#pragma once

#include <cstddef>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "swap/extent_allocator.hpp"
#include "swap/io_queue.hpp"
#include "swap/move_handle.hpp"
#include "swap/swap_file.hpp"

namespace spillway {

class pinned_host_pool;

struct nvme_options {
  /// Swap directories; one swap file in each, tensors striped over them. At least one.
  std::vector<std::string> directories;
  /// Bytes of swap space reserved at start in total, split evenly over the directories
  /// (session_config's nvme.reserve; reserve() adds more later).
  std::uint64_t reserve = std::uint64_t{1} << 30;
  /// When a write finds too little free space, grow the swap files (fallocate) by what is
  /// missing, at least doubling them, before reporting out_of_memory. Off: the space reserved
  /// is all there is.
  bool grow_on_demand = false;
  /// Bytes per I/O; a multiple of every file's O_DIRECT alignment. 1 MiB suits NVMe drives.
  std::uint32_t block_size = 1u << 20;
  /// Operations in flight per ring.
  unsigned queue_depth = 32;
  /// Rings, each with its own I/O thread (one is enough for one or two drives).
  unsigned rings = 1;
  /// -EAGAIN resubmissions per block before it fails.
  unsigned max_retries = 1000;
  /// How long one block's I/O may go without a completion before its move fails (the request
  /// is cancelled; Note [Hung completions] in io_ring.cpp). 0: wait for ever.
  std::chrono::milliseconds io_timeout{30000};
  /// Measure how much of each registered pool region huge pages back, into
  /// nvme_stats::huge_page_bytes. The backing itself is chosen when the region is mapped:
  /// Device::allocate_pinned asks for huge pages before pinning (Note [Huge pages for
  /// registered buffers] in device/huge_pages.cpp), whatever this says. Off: not measured (0).
  bool huge_pages = true;
  /// The I/O seam: makes each ring's queue. Empty means make_uring_queue.
  std::function<std::unique_ptr<io_queue>(unsigned depth)> make_queue;
  /// How swap files are opened (a seam for tests). Empty means ::open.
  file_opener open_file;
};

struct nvme_stats {
  std::uint64_t capacity_bytes = 0;   ///< SUM of swap space reserved
  std::uint64_t stored_bytes = 0;     ///< SUM of bytes of stored tensors (unrounded)
  std::uint64_t free_bytes = 0;       ///< SUM of bytes in free blocks
  std::uint64_t tensors = 0;          ///< COUNT of tensors stored or being written
  std::uint64_t bytes_written = 0;    ///< SUM of tensor bytes written successfully
  std::uint64_t bytes_read = 0;       ///< SUM of tensor bytes read and verified
  std::uint64_t ops = 0;              ///< COUNT of block I/O submissions (retries included)
  std::uint64_t fixed_buffer_ops = 0; ///< COUNT of those on registered (fixed) buffers
  std::uint64_t eagain_retries = 0;   ///< COUNT of -EAGAIN resubmissions
  std::uint64_t short_transfers = 0;  ///< COUNT of short reads/writes continued
  /// SUM over pool regions, each once when first registered, of its bytes mapped by huge pages
  /// right after registration (measured, not advised: Note [Measuring huge-page backing] in
  /// device/huge_pages.cpp). At most the regions' bytes; 0 when huge_pages is off.
  std::uint64_t huge_page_bytes = 0;
  std::uint64_t region_pins = 0;      ///< COUNT of pool regions registered as fixed buffers, each time
  std::uint64_t failed_moves = 0;     ///< COUNT of reads or writes that ended in an error
  std::uint64_t timed_out_ios = 0;    ///< COUNT of block I/Os abandoned after io_timeout
  /// COUNT of those whose late completion has not come yet: their buffers and file blocks are
  /// still held out of use. Read before the other fields, so where it is 0 free_bytes counts
  /// their blocks.
  std::uint64_t abandoned_ios = 0;
  /// False when the kernel refused io_uring and pread/pwrite threads serve the tier instead
  /// (swap/thread_queue.hpp; a warning goes to the log).
  bool io_uring = true;
  std::vector<std::uint64_t> free_bytes_per_file;  ///< free bytes of each swap file, in options order
};

namespace detail {
class io_ring;
struct ring_counters;
class nvme_transfer;
}  // namespace detail

class nvme_tier {
 public:
  /// Called when a move finishes, before its handle becomes ready, on an I/O thread; null on
  /// success. Must not throw or call back into this tier's write/read.
  using completion = std::function<void(std::exception_ptr)>;

  /// Opens and reserves the swap files (see the guarantees above). `pool` (may be null) is
  /// the pinned host pool whose regions are registered with io_uring as fixed buffers.
  explicit nvme_tier(nvme_options options, pinned_host_pool* pool = nullptr);
  /// Waits for every move in flight, then closes the files (their space goes back).
  ~nvme_tier();
  nvme_tier(const nvme_tier&) = delete;
  nvme_tier& operator=(const nvme_tier&) = delete;

  /// Writes `bytes` bytes from `src` as tensor `name` (not stored yet). `src` must stay valid
  /// and unchanged until the handle is ready. `src_capacity`: bytes readable at `src` (>=
  /// bytes); when src is aligned and src_capacity covers the last block rounded up to the
  /// alignment, the I/O goes straight from src (pinned-pool blocks qualify), else through a
  /// bounce buffer. Throws out_of_memory (with a diagnosis) when the swap space is full.
  move_handle write(const std::string& name, const void* src, std::size_t bytes, std::size_t src_capacity = 0,
                    completion on_done = {});
  /// Reads tensor `name` into `dst` (its size() bytes); `dst_capacity` as for write. The
  /// tensor stays stored. Throws usage_error when `name` is not stored or is being written.
  move_handle read(const std::string& name, void* dst, std::size_t dst_capacity = 0, completion on_done = {});
  /// Frees a stored tensor's blocks. Throws usage_error when it is being written or read.
  void erase(const std::string& name);
  /// Runs `release` (which frees `buffer`) now, or, when `buffer` is the buffer of a move that
  /// timed out and whose I/O the kernel may still be doing, once that I/O has really ended (on
  /// an I/O thread, or in the destructor). For callers that reuse the buffers of failed moves.
  void after_settled(const void* buffer, std::function<void()> release);

  [[nodiscard]] bool contains(const std::string& name) const;
  /// The tensor's size in bytes; throws when not stored.
  [[nodiscard]] std::size_t size(const std::string& name) const;
  [[nodiscard]] nvme_stats stats() const;
  /// Grows the reserved swap space to at least `bytes` in total (split evenly over the files,
  /// each rounded up to whole blocks); nothing when it is already that large. Throws
  /// out_of_memory naming the directory whose file system cannot hold its share (files grown
  /// before it stay grown), io_error when fallocate fails otherwise.
  void reserve(std::uint64_t bytes);
  /// The most reserve() could reach now: the space reserved plus, per file, its share of what
  /// its file system has free (files on one file system share it).
  [[nodiscard]] std::uint64_t reservable_bytes() const;
  [[nodiscard]] const nvme_options& options() const noexcept { return options_; }
  /// The largest O_DIRECT alignment over the swap files.
  [[nodiscard]] std::uint32_t alignment() const noexcept { return alignment_; }
  /// True when io_uring serves the tier (false after the pread/pwrite fallback).
  [[nodiscard]] bool io_uring() const noexcept { return io_uring_; }
  /// True when every swap file uses O_DIRECT (false after a buffered fallback).
  [[nodiscard]] bool direct_io() const noexcept { return direct_; }

 private:
  friend class detail::nvme_transfer;
  struct placement {  // one block's home
    std::uint32_t file;
    std::uint64_t offset;
  };
  struct record {
    std::size_t bytes = 0;
    std::vector<placement> blocks;
    std::vector<std::uint32_t> crc;
    std::vector<std::pair<std::uint32_t, extent>> extents;  // (file, extent)
    bool writing = true;
    int readers = 0;
  };

  void place(record& r, const std::string& name);  // under mutex_
  void release(record& r);                         // under mutex_
  void grow_files(std::uint64_t per_file);         // under mutex_
  void finished(detail::nvme_transfer* t, std::exception_ptr error) noexcept;  // the move is over
  void retire(detail::nvme_transfer* t) noexcept;  // and the kernel is done with all its blocks
  move_handle start(std::unique_ptr<detail::nvme_transfer> t);

  nvme_options options_;
  pinned_host_pool* pool_;
  std::vector<swap_file> files_;
  std::uint32_t alignment_ = 4096;
  bool direct_ = true;
  bool io_uring_ = true;

  mutable std::mutex mutex_;
  std::condition_variable idle_cv_;
  std::vector<extent_allocator> space_;  // one per file
  std::unordered_map<std::string, std::unique_ptr<record>> tensors_;
  std::uint64_t stored_bytes_ = 0;
  std::uint64_t bytes_written_ = 0;
  std::uint64_t bytes_read_ = 0;
  std::uint64_t failed_moves_ = 0;
  std::uint64_t in_flight_ = 0;
  std::uint32_t next_start_file_ = 0;
  std::vector<detail::nvme_transfer*> abandoned_;  // finished, with blocks the kernel still holds

  std::unique_ptr<detail::ring_counters> counters_;
  std::vector<std::unique_ptr<detail::io_ring>> rings_;  // last: stopped first
};

}  // namespace spillway
