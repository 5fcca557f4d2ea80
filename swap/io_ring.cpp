// The I/O ring's thread: fill the queue, wait for one completion then peek the rest, requeue
// what must be retried, finish what is done. See Note [Keeping the queue full].
#include "swap/io_ring.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <string>

#include <sys/resource.h>

#include "allocator/pinned_host_pool.hpp"
#include "device/error.hpp"
#include "device/log.hpp"
#include "device/huge_pages.hpp"

namespace spillway::detail {

// Note [Keeping the queue full]
// The thread owns its queue. Each turn it moves posted blocks into a local ready list, submits
// as many as the queue has room for in one batch, then reaps: it waits for the first
// completion (up to 500 us when more work could arrive, so newly posted blocks are not held up
// by a slow drive) and peeks the rest. -EAGAIN puts the block back at the front of the ready
// list; a short transfer advances the block's op past the bytes done and puts it back too; a
// result of 0 with bytes left is an error (end of file / no progress). Nothing is asserted:
// every failure becomes the block's result and reaches its owner.
// Finished blocks are handed to their owners only after the next batch is submitted: the
// owner's work (CRC32C of the block) then overlaps the drive's, instead of draining the queue.

// Note [Hung completions]
// A drive or a kernel can lose a completion: the request is in flight and nothing comes back.
// Waiting for ever would hang training with no word of why, so each submitted block gets a
// deadline (nvme_options::io_timeout after its submission). When it passes, the ring asks the
// queue to cancel the request (io_uring: IORING_OP_ASYNC_CANCEL; the thread queue can only drop
// an op no thread has started) and tells the block's owner, which fails its move with an
// io_error naming the tensor, the swap directory and "no completion after N ms". The block is
// *abandoned*, not finished: the kernel may still be reading into or writing from its buffer, and
// the request still occupies a place in the file. So the block stays in flight until its late
// completion (or the cancel's -ECANCELED) is reaped; only then does its owner free the block, its
// buffer (nvme_tier::after_settled holds a caller's buffer back as well) and its place in the file.
// A ring stopping with abandoned blocks does not wait for them: it closes its queue (io_uring's
// teardown and the thread queue's join wait for the kernel) and then completes them -ECANCELED.

namespace {
constexpr std::size_t max_fixed_buffer = std::size_t{1} << 30;  // io_uring's limit per buffer
}

io_ring::io_ring(std::unique_ptr<io_queue> queue, pinned_host_pool* pool, ring_counters& counters,
                 unsigned max_retries, bool huge_pages, std::chrono::milliseconds timeout)
    : queue_(std::move(queue)), pool_(pool), counters_(counters), max_retries_(max_retries), huge_pages_(huge_pages),
      timeout_(timeout) {
  refresh_buffers();  // pinning is slow: pay for the regions that exist now here, not on the first move
  thread_ = std::thread([this] { run(); });
}

io_ring::~io_ring() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  queue_->unregister_buffers();
  queue_.reset();  // waits for what the kernel still holds
  for (block_io* b : flying_) {  // abandoned, their completions never came
    counters_.abandoned.fetch_sub(1, std::memory_order_relaxed);
    b->owner->complete(*b, -ECANCELED);
  }
}

void io_ring::post(const std::vector<block_io*>& blocks) {
  if (blocks.empty()) return;
  {
    std::lock_guard lock(m_);
    pending_.insert(pending_.end(), blocks.begin(), blocks.end());
  }
  cv_.notify_one();
}

namespace {

// What a user can do about a refused registration: the kernel counts fixed buffers against the
// locked-memory limit (RLIMIT_MEMLOCK) of a process without CAP_IPC_LOCK and answers -ENOMEM
// past it. Empty for other errors, and where the limit is not what stood in the way.
std::string registration_hint(int rc, std::span<const iovec> iov) {
  if (rc != -ENOMEM) return {};
  rlimit lim{};
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return {};
  std::uint64_t want = 0;
  for (const auto& v : iov) want += v.iov_len;
  if (want <= lim.rlim_cur) return {};  // below the limit: something else refused it
  return "; the locked-memory limit (RLIMIT_MEMLOCK) is " + std::to_string(lim.rlim_cur >> 10) + " KiB, below the " +
         std::to_string((want + 1023) >> 10) +
         " KiB of pinned buffers: raise it (ulimit -l, or LimitMEMLOCK= for a service) or grant CAP_IPC_LOCK";
}

}  // namespace

void io_ring::refresh_buffers() {
  if (pool_ == nullptr || registration_failed_) return;
  // Read before the regions: a change after this read shows as a newer generation, and run()
  // then uses no fixed buffer until the next refresh (Note [Fixed buffers and pool changes]).
  const std::uint64_t generation = pool_->generation();
  const auto regions = pool_->regions();
  std::vector<registered> want;
  std::vector<iovec> iov;
  for (const auto& r : regions) {
    if (r.bytes == 0 || r.bytes > max_fixed_buffer) continue;
    want.push_back({reinterpret_cast<std::uintptr_t>(r.base), r.bytes, static_cast<int>(iov.size()), r.id});
    iov.push_back({r.base, r.bytes});
  }
  std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) { return a.base < b.base; });
  // Whatever follows leaves registered_ describing `regions` (or empty, so no fixed buffer).
  registered_generation_ = generation;
  const bool same = want.size() == registered_.size() &&
                    std::equal(want.begin(), want.end(), registered_.begin(),
                               [](const auto& a, const auto& b) { return a.same_region(b); });
  if (same) return;
  // Note [Counting huge-page bytes]
  // The pool's regions were marked for huge pages by allocate_pinned before anything pinned
  // them (Note [Huge pages for registered buffers]); advising now would come too late. The ring
  // only measures: each region new to it is measured once, right after it is registered (which
  // faults its pages in), and what huge pages back is added to huge_page_bytes
  // (Note [Measuring huge-page backing]). A region registered again (whole-list fallback) is
  // not counted again; a region that left the pool and came back is a new region. With several
  // rings only the first measures (nvme_tier passes huge_pages to it alone), so a region counts
  // once; a region that ring does not register (it registers when it next has work) is missed.
  std::vector<registered> fresh;  // registered by this call for the first time, not measured yet
  for (const auto& w : want) {
    const bool seen = std::any_of(registered_.begin(), registered_.end(),
                                  [&](const registered& r) { return r.same_region(w); });
    if (!seen) fresh.push_back(w);
  }
  const auto measure = [&](const registered& w) {
    if (!huge_pages_) return;
    auto it = std::find_if(fresh.begin(), fresh.end(), [&](const registered& f) { return f.same_region(w); });
    if (it == fresh.end()) return;
    fresh.erase(it);
    counters_.huge_page_bytes.fetch_add(huge_page_backed_bytes(reinterpret_cast<const void*>(w.base), w.bytes),
                                        std::memory_order_relaxed);
  };
  // Note [Registering one region at a time]
  // The pool grows a region at a time while tensors arrive. Registering the whole list again
  // would pin every region again on each growth, a cost that grows with the square of the region
  // count; with a sparse table (a fixed number of empty slots, Linux 5.13 and later) each new
  // region is pinned once, into the next slot. A region that left the pool, a full table or a
  // queue without slots falls back to registering the whole list.
  const bool any_gone = std::any_of(registered_.begin(), registered_.end(), [&](const registered& r) {
    return !std::any_of(want.begin(), want.end(), [&](const registered& w) { return w.same_region(r); });
  });
  if (slots_ != slot_table::unsupported) {
    if (slots_ == slot_table::untried || any_gone) {
      registered_.clear();
      next_slot_ = 0;
      slots_ = queue_->reserve_buffer_slots(max_slots) == 0 ? slot_table::on : slot_table::unsupported;
    }
    bool ok = slots_ == slot_table::on;
    for (const auto& w : want) {
      if (!ok) break;
      const bool seen = std::any_of(registered_.begin(), registered_.end(),
                                    [&](const registered& r) { return r.same_region(w); });
      if (seen) continue;
      if (next_slot_ >= max_slots || queue_->update_buffer(next_slot_, iovec{reinterpret_cast<void*>(w.base), w.bytes}) != 0) {
        ok = false;
        break;
      }
      registered_.push_back({w.base, w.bytes, static_cast<int>(next_slot_++), w.region});
      counters_.region_pins.fetch_add(1, std::memory_order_relaxed);
      measure(w);
    }
    if (ok) {
      std::sort(registered_.begin(), registered_.end(), [](const auto& a, const auto& b) { return a.base < b.base; });
      return;
    }
    slots_ = slot_table::unsupported;
  }
  registered_.clear();
  const int rc = queue_->register_buffers(iov);
  if (rc == 0) counters_.region_pins.fetch_add(iov.size(), std::memory_order_relaxed);
  if (rc < 0) {
    registration_failed_ = true;
    log(log_level::warning, std::string("nvme tier: cannot register pinned buffers with io_uring (") +
                                std::strerror(-rc) + "); using unregistered buffers" + registration_hint(rc, iov));
    return;
  }
  for (const auto& w : want) measure(w);
  registered_ = std::move(want);
}

int io_ring::buffer_index(const void* p, std::size_t n) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto it = std::upper_bound(registered_.begin(), registered_.end(), addr,
                             [](std::uintptr_t a, const registered& r) { return a < r.base; });
  if (it == registered_.begin()) return -1;
  --it;
  return addr + n <= it->base + it->bytes ? it->index : -1;
}

void io_ring::finish(block_io* b, int result) noexcept { finished_.emplace_back(b, result); }

void io_ring::abandon_overdue() noexcept {
  const auto now = std::chrono::steady_clock::now();
  for (block_io* b : flying_) {
    if (b->abandoned || now < b->deadline) continue;
    b->abandoned = true;
    ++abandoned_;
    counters_.timed_out.fetch_add(1, std::memory_order_relaxed);
    counters_.abandoned.fetch_add(1, std::memory_order_relaxed);
    (void)queue_->cancel(b);  // whether it wins shows in the completion, still awaited
    b->owner->abandon(*b, timeout_);
  }
}

void io_ring::handle(io_completion c, std::deque<block_io*>& ready, unsigned& in_flight) noexcept {
  auto* b = static_cast<block_io*>(c.op);
  --in_flight;
  const int res = c.result;
  flying_[b->flying_slot] = flying_.back();  // out of the list, in O(1)
  flying_[b->flying_slot]->flying_slot = b->flying_slot;
  flying_.pop_back();
  if (b->abandoned) {  // the late completion: only now may the owner free the block and its buffer
    --abandoned_;
    finish(b, res < 0 ? res : 0);  // counted down once the owner has had it (run())
    return;
  }
  if (res == -EAGAIN || res == -EINTR) {
    if (++b->retries > max_retries_) {
      finish(b, -EAGAIN);
      return;
    }
    counters_.eagain_retries.fetch_add(1, std::memory_order_relaxed);
    ready.push_front(b);
    return;
  }
  if (res < 0) {
    finish(b, res);
    return;
  }
  const auto done = static_cast<std::uint32_t>(res);
  if (done >= b->length) {
    finish(b, 0);
    return;
  }
  if (done == 0) {  // no progress: end of file on a read, a stuck write
    finish(b, -EIO);
    return;
  }
  counters_.short_transfers.fetch_add(1, std::memory_order_relaxed);
  b->buffer = static_cast<char*>(b->buffer) + done;
  b->offset += done;
  b->length -= done;
  ready.push_front(b);
}

void io_ring::run() {
  const unsigned depth = queue_->depth();
  std::deque<block_io*> ready;
  std::vector<io_op*> batch;
  std::vector<io_completion> done(depth);
  unsigned in_flight = 0;
  for (;;) {
    {
      std::unique_lock lock(m_);
      if (in_flight == 0 && ready.empty() && finished_.empty())
        cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (stop_ && pending_.empty() && in_flight == abandoned_ && ready.empty() && finished_.empty()) return;
      ready.insert(ready.end(), pending_.begin(), pending_.end());
      pending_.clear();
    }
    if (in_flight == 0 && !ready.empty()) refresh_buffers();
    // Note [Fixed buffers and pool changes]
    // io_uring knows a fixed buffer by its address, and keeps the pages it pinned at
    // registration. The pool may unpin an empty region and pin a new one, which mmap often
    // places at the freed address: a block there matches the old entry by address, and a
    // fixed read or write would move the old pages, not the block's (the CRC then fails a
    // good read). The registration is refreshed only while nothing is in flight, so until
    // then, once the pool has changed, ops use plain buffers. Every op here was queued before
    // this read, and a live block's region outlives it, so an unchanged generation means every
    // op's region is registered as it is.
    const bool registration_current = pool_ == nullptr || pool_->generation() == registered_generation_;
    batch.clear();
    while (in_flight + batch.size() < depth && !ready.empty()) {
      block_io* b = ready.front();
      ready.pop_front();
      if (!b->prepared) {
        b->owner->prepare(*b);
        b->prepared = true;
      }
      b->buffer_index = registration_current ? buffer_index(b->buffer, b->length) : -1;
      if (b->buffer_index >= 0) counters_.fixed_ops.fetch_add(1, std::memory_order_relaxed);
      batch.push_back(b);
    }
    if (!batch.empty()) {
      try {
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        for (io_op* op : batch) static_cast<block_io*>(op)->deadline = deadline;
        const std::size_t taken = std::min(queue_->submit(batch), batch.size());
        for (std::size_t i = 0; i < taken; ++i) {
          auto* b = static_cast<block_io*>(batch[i]);
          b->flying_slot = static_cast<std::uint32_t>(flying_.size());
          flying_.push_back(b);
        }
        in_flight += static_cast<unsigned>(taken);
        counters_.ops.fetch_add(taken, std::memory_order_relaxed);
        // Ops the queue did not take were not started: they fail as a refused submission does.
        for (std::size_t i = taken; i < batch.size(); ++i) finish(static_cast<block_io*>(batch[i]), -EBUSY);
      } catch (const io_error& e) {
        const int err = e.error_number() != 0 ? e.error_number() : EIO;
        for (io_op* op : batch) finish(static_cast<block_io*>(op), -err);
      } catch (...) {
        for (io_op* op : batch) finish(static_cast<block_io*>(op), -EIO);
      }
    }
    for (auto [b, result] : finished_) {
      const bool late = b->abandoned;  // read first: complete() may free b
      b->owner->complete(*b, result);
      // A late completion is counted down only now that the owner has freed its blocks, so a
      // count of 0 means they are back (nvme_tier::stats reads the count first).
      if (late) counters_.abandoned.fetch_sub(1, std::memory_order_release);
    }
    finished_.clear();
    if (in_flight == 0) continue;
    const auto timeout = ready.empty() ? std::chrono::microseconds(500) : std::chrono::microseconds(100000);
    std::size_t n = 0;
    try {
      n = queue_->reap(std::span<io_completion>(done.data(), std::min<std::size_t>(done.size(), in_flight)), timeout);
    } catch (const std::exception& e) {
      log(log_level::error, std::string("nvme tier: reaping completions failed: ") + e.what());
    }
    for (std::size_t i = 0; i < n; ++i) handle(done[i], ready, in_flight);
    if (timeout_.count() > 0 && flying_.size() > abandoned_) abandon_overdue();
  }
}

}  // namespace spillway::detail
