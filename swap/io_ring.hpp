// One I/O ring and the thread that serves it: keeps its io_queue full, reaps completions,
// requeues -EAGAIN and short transfers, and hands each finished block back to its owner.
// Internal to the NVMe tier (detail namespace).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "swap/io_queue.hpp"

namespace spillway {
class pinned_host_pool;
}

namespace spillway::detail {

struct block_io;

/// Whoever issued a block (a tensor transfer). Both hooks run on the ring's thread and must
/// not throw.
class block_owner {
 public:
  /// Called once before the block's first submission (a bounced write fills its buffer).
  virtual void prepare(block_io& b) noexcept = 0;
  /// Called once when the block is finished: `result` is its full length, or -errno.
  /// The block may be freed by the owner from here on. For a block abandoned before (see
  /// abandon), this is the late completion: the kernel is done with its buffer only now.
  virtual void complete(block_io& b, int result) noexcept = 0;
  /// Called once when the block's completion is `after` overdue (Note [Hung completions]). The
  /// block stays in flight, cancelled, and still ends in complete(); until then its buffer and
  /// its place in the file must not be reused.
  virtual void abandon(block_io& b, std::chrono::milliseconds after) noexcept = 0;

 protected:
  ~block_owner() = default;
};

/// One block's transfer. The io_op part goes through the queue; the ring advances it on a
/// short transfer, so the owner keeps the original placement itself.
struct block_io : io_op {
  block_owner* owner = nullptr;
  std::uint32_t index = 0;  ///< block number within its owner
  unsigned retries = 0;     ///< -EAGAIN retries so far
  bool prepared = false;
  bool abandoned = false;   ///< overdue and cancelled; its completion is awaited, not used
  std::uint32_t flying_slot = 0;  ///< its place in the ring's list of blocks in flight
  std::chrono::steady_clock::time_point deadline{};  ///< when its completion is overdue
};

/// Counters the rings share with their tier (all SUM or COUNT, relaxed atomics).
struct ring_counters {
  std::atomic<std::uint64_t> ops{0};              ///< COUNT of submissions (retries included)
  std::atomic<std::uint64_t> fixed_ops{0};        ///< COUNT of submissions on registered buffers
  std::atomic<std::uint64_t> eagain_retries{0};   ///< COUNT of -EAGAIN resubmissions
  std::atomic<std::uint64_t> short_transfers{0};  ///< COUNT of short reads/writes continued
  std::atomic<std::uint64_t> huge_page_bytes{0};  ///< SUM of new regions' bytes huge pages back (measured)
  std::atomic<std::uint64_t> region_pins{0};      ///< COUNT of pool regions registered (each time)
  std::atomic<std::uint64_t> timed_out{0};        ///< COUNT of blocks abandoned after io_timeout
  std::atomic<std::uint64_t> abandoned{0};        ///< COUNT of abandoned blocks not completed yet
};

class io_ring {
 public:
  /// `pool` (may be null): its regions are registered as fixed buffers now and again whenever
  /// the ring is idle and they have changed; with `huge_pages`, each region new to the ring is
  /// measured for huge-page backing once registered (Note [Counting huge-page bytes]).
  /// `max_retries`: -EAGAIN resubmissions per block before it fails. `timeout`: how long a
  /// submitted block may wait for its completion before it is abandoned (0: for ever).
  io_ring(std::unique_ptr<io_queue> queue, pinned_host_pool* pool, ring_counters& counters, unsigned max_retries,
          bool huge_pages, std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Finishes everything posted, then stops; abandoned blocks still in flight then end in
  // complete(-ECANCELED) once the queue is closed (the kernel is done with them).
  ~io_ring();
  io_ring(const io_ring&) = delete;
  io_ring& operator=(const io_ring&) = delete;

  /// Queues blocks for this ring's thread. Thread-safe.
  void post(const std::vector<block_io*>& blocks);

 private:
  struct registered {
    std::uintptr_t base;
    std::size_t bytes;
    int index;
    std::uint64_t region;  // pinned_region::id: the same range pinned again is not the same buffer
    [[nodiscard]] bool same_region(const registered& o) const noexcept {
      return base == o.base && bytes == o.bytes && region == o.region;
    }
  };

  void run();
  void refresh_buffers();
  [[nodiscard]] int buffer_index(const void* p, std::size_t n) const;
  void finish(block_io* b, int result) noexcept;
  void handle(io_completion c, std::deque<block_io*>& ready, unsigned& in_flight) noexcept;
  void abandon_overdue() noexcept;

  std::unique_ptr<io_queue> queue_;
  pinned_host_pool* pool_;
  ring_counters& counters_;
  unsigned max_retries_;
  bool huge_pages_;
  std::vector<registered> registered_;  // sorted by base; only touched by the ring's thread
  std::uint64_t registered_generation_ = 0;  // the pool's generation() registered_ describes
  bool registration_failed_ = false;
  enum class slot_table : std::uint8_t { untried, on, unsupported };
  slot_table slots_ = slot_table::untried;  // Note [Registering one region at a time]
  unsigned next_slot_ = 0;
  static constexpr unsigned max_slots = 4096;
  std::vector<std::pair<block_io*, int>> finished_;  // done, not yet handed to owners
  std::chrono::milliseconds timeout_;
  std::vector<block_io*> flying_;  // submitted, not reaped (abandoned ones included)
  unsigned abandoned_ = 0;         // of flying_

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<block_io*> pending_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace spillway::detail
