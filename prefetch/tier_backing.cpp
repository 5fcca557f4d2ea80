// tier_backing: copies between device memory and the host / NVMe tiers, in stream order, with
// no host function (Note [Moves without host functions]). To NVMe the bytes go through a pinned
// staging block; a failed write keeps them there.
#include "prefetch/tier_backing.hpp"

#include <algorithm>
#include <utility>

#include <cstring>

#include "allocator/pinned_host_pool.hpp"
#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway {
namespace {
std::shared_ptr<detail::move_state> new_state() { return std::make_shared<detail::move_state>(); }

/// Waits for a move without rethrowing its error (the executor reports errors from its own
/// handles; here only the ordering matters).
void wait_quietly(const move_handle& h) {
  try {
    h.wait();
  } catch (...) {  // NOLINT(bugprone-empty-catch): reported through the executor's handle
  }
}
}  // namespace

tier_backing::tier_backing(Device& device, host_tier& host, nvme_tier* nvme)
    : device_(device), host_(host), nvme_(nvme), marks_(std::make_shared<event_pool>(device)) {}

tier_backing::~tier_backing() {
  drain();
  std::lock_guard lock(mutex_);
  for (auto& c : copies_) free_copy(c);
  for (auto& c : retired_) free_copy(c);  // drain ended their moves
}

tier_backing::copy& tier_backing::slot(tensor_id id) {
  if (id >= copies_.size()) copies_.resize(id + 1);
  return copies_[id];
}

std::size_t tier_backing::capacity_of(std::uint64_t bytes) const noexcept {
  return round_up(bytes, host_.pool().options().alignment);
}

void* tier_backing::staging_block(std::uint64_t bytes) { return host_.pool().allocate(bytes); }

void tier_backing::free_staging(void* p, std::uint64_t bytes) noexcept { host_.pool().deallocate(p, bytes); }

void tier_backing::free_copy(copy& c) {
  if (c.host != nullptr) {
    if (c.staging) free_staging(c.host, c.bytes);
    else host_.deallocate(c.host, c.bytes);
  }
  if (!c.nvme_name.empty() && nvme_ != nullptr && nvme_->contains(c.nvme_name)) nvme_->erase(c.nvme_name);
  c.host = nullptr;
  c.staging = false;
  c.nvme_name.clear();
  c.where.reset();
}

// Note [Retired copies]
// A tensor's tier copy is superseded when the tensor is saved again or released, but a move
// enqueued earlier may still use it: the load that brought the tensor to the device reads it,
// an earlier save may still be writing it. The host runs ahead of the device, so waiting here
// for those moves would hold the host back to the device's pace, op by op. Instead the old copy
// is retired: kept, with the moves that use it, and freed once they have all ended (checked at
// the next save or release, and at drain). Only when the host tier is out of room does a save
// wait for retired copies to free theirs.

// Note [Moves without host functions]
// Host functions of every stream share one callback thread and may neither call the Device nor
// wait (device/device.hpp), so no move here uses one. A move's handle carries a device event
// recorded right after its copy; the move is over when the device reaches it, and a consumer
// stream waits on it on the device (move_handle::stream_wait). What must follow a copy on the
// host runs on the worker thread (event_worker), which waits for the copy's event: starting
// the NVMe write of a staged save, freeing the staging block of a load. A load from NVMe is
// pipelined without any thread of the device waiting for I/O: the read's completion, on the
// I/O thread, enqueues the H2D copy and records the handle's event; until then stream_wait
// waits on the caller's thread, as a stream wait on an event not yet recorded would not wait.

namespace {
/// Forgets the moves of `c` that are over, so that none is asked again; true when none is left.
/// A move the device cannot answer for (it failed: its errors are sticky) is waited for, quietly:
/// the failed device then runs no more of its work, and its error is the executor's to report.
bool moves_over(std::vector<move_handle>& in_flight) {
  std::erase_if(in_flight, [](const move_handle& h) {
    try {
      return h.ready();
    } catch (...) {
      wait_quietly(h);
      return true;
    }
  });
  return in_flight.empty();
}
}  // namespace

void tier_backing::retire(copy& c) {
  const bool busy = !moves_over(c.in_flight);
  if (busy && (c.host != nullptr || !c.nvme_name.empty())) {
    retired_.push_back(std::move(c));
    c = copy{};
    return;
  }
  c.in_flight.clear();
  free_copy(c);
}

void tier_backing::free_settled() {
  // Oldest first, up to the first copy still in use: moves end about in the order they were
  // enqueued, so the copies behind it are most likely in use too, and asking each of them on
  // every save would cost Device calls per retired copy per op. drain() and a host tier out of
  // room (allocate_host) free the rest.
  std::size_t n = 0;
  while (n < retired_.size() && moves_over(retired_[n].in_flight)) free_copy(retired_[n++]);
  retired_.erase(retired_.begin(), retired_.begin() + static_cast<std::ptrdiff_t>(n));
}

void tier_backing::free_all_settled() {
  std::erase_if(retired_, [&](copy& c) {
    if (!moves_over(c.in_flight)) return false;
    free_copy(c);
    return true;
  });
}

out_of_memory tier_backing::no_room(const out_of_memory& e, const std::string& name, std::uint64_t bytes,
                                    const char* what) const {
  // The tier's own capacity, or the system refusing to pin more below it: each has its remedy.
  const auto st = host_.stats();
  const bool tier_full = st.capacity_bytes != 0 && st.used_bytes + capacity_of(bytes) > st.capacity_bytes;
  return out_of_memory(std::string(e.what()) + "; tensor \"" + name + "\" " + what + ": " +
                       (tier_full ? "give a larger host budget or an NVMe swap directory"
                                  : "the system would not pin more host memory; free host memory, or give an NVMe "
                                    "swap directory"));
}

void* tier_backing::allocate_host(const std::string& name, std::uint64_t bytes, std::unique_lock<std::mutex>& lock) {
  try {
    return host_.allocate(name, bytes);
  } catch (const out_of_memory&) {
    if (retired_.empty()) throw;
  }
  // Out of room while retired copies hold some: wait for their moves, free them, try again.
  std::vector<move_handle> pending;
  for (auto& c : retired_)
    for (auto& h : c.in_flight) pending.push_back(h);
  lock.unlock();
  for (auto& h : pending) wait_quietly(h);
  lock.lock();
  free_all_settled();
  return host_.allocate(name, bytes);
}

// Enqueues a copy on `s` and records `mark` after it. When the device refuses the record, the
// copy is waited for instead: it is then over, and the mark, unrecorded, asks nobody to wait.
// When it refuses the copy, or the wait reports a failure, the mark is settled unrecorded and
// the device's error thrown; `enqueued` says whether the copy was enqueued (and so whether the
// device may still touch its memory).
// `before_mark` (noexcept) runs once the copy is enqueued, before the mark that ends it: what it
// records behind the copy is reached by the time a wait for the mark returns.
void tier_backing::copy_then_mark(void* dst, const void* src, std::uint64_t bytes, copy_kind kind, stream s,
                                  detail::device_mark& mark, bool& enqueued, const std::function<void()>& before_mark) {
  try {
    device_.copy_async(dst, src, bytes, kind, s);
    enqueued = true;
  } catch (...) {
    mark.abandon();
    throw;
  }
  if (before_mark) before_mark();
  try {
    mark.record(s);
  } catch (...) {
    device_.synchronize_stream(s);
  }
}

// A save whose copy out of the device failed: the tensor keeps no tier copy (the old one was
// stale: the device held a newer value), and the block it was to fill goes back, unless the
// copy was enqueued: a failed device may still write it, so it is left, as a read that timed out
// leaves its block (Note [Hung completions] in swap/io_ring.cpp).
void tier_backing::forget_failed_save(tensor_id id, void* block, bool staging, bool enqueued) noexcept {
  std::lock_guard lock(mutex_);
  auto& c = slot(id);
  if (c.host == block || (staging && c.where == tier::nvme)) {
    c.host = nullptr;
    c.nvme_name.clear();
    c.where.reset();
    c.staging = false;
  }
  if (enqueued) return;
  if (staging) free_staging(block, c.bytes);
  else host_.deallocate(block, c.bytes);
}

// A save's copy off the device into `dst` (a host block, or a staging block on the way to
// NVMe), with its mark. When the device refuses, the save is forgotten and its move ends with
// the device's error, which is thrown.
void tier_backing::copy_out(tensor_id id, void* dst, bool staging, const void* src, std::uint64_t bytes, stream s,
                            detail::device_mark& mark, detail::move_state& state) {
  bool enqueued = false;
  try {
    copy_then_mark(dst, src, bytes, copy_kind::device_to_host, s, mark, enqueued);
  } catch (...) {
    forget_failed_save(id, dst, staging, enqueued);
    state.finish(std::current_exception());
    throw;
  }
}

std::exception_ptr tier_backing::settle(tensor_id id) {
  std::vector<move_handle> pending;
  {
    std::lock_guard lock(mutex_);
    pending.swap(slot(id).in_flight);
  }
  std::exception_ptr first;
  for (auto& h : pending) {
    wait_quietly(h);
    if (!first) first = h.error();
  }
  return first;
}

move_handle tier_backing::save(tensor_id id, const std::string& name, const void* src, std::uint64_t bytes, tier to,
                               stream s) {
  auto mark = detail::make_mark(marks_);  // after the D2H copy (made here: it calls the Device)
  std::unique_lock lock(mutex_);
  free_settled();
  retire(slot(id));
  auto state = new_state();

  void* block = nullptr;
  if (to == tier::host || nvme_ == nullptr) {
    try {
      block = allocate_host(name, bytes, lock);
    } catch (const out_of_memory& e) {
      if (nvme_ == nullptr) throw no_room(e, name, bytes, "cannot leave the device");
    }
  }
  auto& c = slot(id);  // after allocate_host, which may have let go of the lock
  c.bytes = bytes;
  if (block != nullptr) {  // device -> host tier: done when the device reaches the event
    c.where = tier::host;
    c.host = block;
    counters_.d2h_bytes += bytes;
    move_handle handle(state, mark);
    c.in_flight.push_back(handle);
    lock.unlock();
    copy_out(id, block, false, src, bytes, s, *mark, *state);
    state->finish(nullptr);  // the host part (enqueueing) is over; Note [Moves without host functions]
    return handle;
  }

  // device -> staging -> NVMe. The staging block holds the bytes until the write is verified.
  void* staging = staging_block(bytes);
  c.where = tier::nvme;
  c.nvme_name = name + "#" + std::to_string(id) + "." + std::to_string(++generation_);
  const std::string file_name = c.nvme_name;
  counters_.d2h_bytes += bytes;
  counters_.nvme_write_bytes += bytes;
  move_handle handle(state);  // ends in file I/O: no device event to wait on
  c.in_flight.push_back(handle);
  lock.unlock();
  copy_out(id, staging, true, src, bytes, s, *mark, *state);
  worker_.after(mark, [this, id, name, file_name, staging, bytes, state](std::exception_ptr device_error) {
    write_staged(id, name, file_name, staging, bytes, state, std::move(device_error));
  });
  return handle;
}

void tier_backing::write_staged(tensor_id id, const std::string& name, const std::string& file_name, void* staging,
                                std::uint64_t bytes, const std::shared_ptr<detail::move_state>& state,
                                std::exception_ptr device_error) {
  // On the worker thread, once the D2H copy into `staging` is done (or the device failed).
  auto keep_on_host = [this, id, file_name, staging, bytes](bool bytes_good) {
    std::lock_guard guard(mutex_);
    auto& cc = slot(id);
    if (cc.nvme_name == file_name && bytes_good) {  // still this copy: it lives on in the staging block
      cc.nvme_name.clear();
      cc.where = tier::host;
      cc.host = staging;
      cc.staging = true;
      return;
    }
    if (cc.nvme_name == file_name) {  // the copy never reached the host: there is no copy
      cc.nvme_name.clear();
      cc.where.reset();
    }
    free_staging(staging, bytes);
  };
  if (device_error) {
    keep_on_host(false);
    state->finish(std::move(device_error));
    return;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    (void)nvme_->write(file_name, staging, bytes, capacity_of(bytes),
                       [this, name, t0, staging, bytes, state, keep_on_host](std::exception_ptr err) {
                         // On an I/O thread: an ordinary thread, so the pool may be called here.
                         note_io(true, name, t0);
                         if (err) keep_on_host(true);
                         else free_staging(staging, bytes);
                         state->finish(std::move(err));  // Note [Errors that cross threads]
                       });
  } catch (...) {  // the swap space is full, or the tier refused: the bytes stay on the host
    auto err = std::current_exception();
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      err = std::make_exception_ptr(io_error("tensor \"" + name + "\" could not be written to the NVMe tier (" +
                                             e.what() + "); it is kept in host memory", 0));
    }
    keep_on_host(true);
    state->finish(std::move(err));
  }
}

void tier_backing::note_io(bool write, const std::string& name, std::chrono::steady_clock::time_point start) {
  if (!keep_spans_) return;
  const auto end = std::chrono::steady_clock::now();
  std::lock_guard lock(spans_mutex_);
  spans_.push_back(io_span{write, name, start, end});
}

std::vector<copy_span> tier_backing::take_copy_spans() {
  std::lock_guard lock(spans_mutex_);
  return std::exchange(copy_spans_, {});
}

std::vector<io_span> tier_backing::take_io_spans() {
  std::lock_guard lock(spans_mutex_);
  return std::exchange(spans_, {});
}

move_handle tier_backing::load(tensor_id id, const std::string& name, void* dst, std::uint64_t bytes, stream s) {
  // A host copy is written by its save's D2H copy, which the caller orders before this load on
  // the device (move_handle::stream_wait); only an NVMe copy must be complete here.
  bool host_copy = false;
  {
    std::lock_guard lock(mutex_);
    const auto& c = slot(id);
    host_copy = c.where.has_value() && *c.where == tier::host;
  }
  const std::exception_ptr save_error = host_copy ? nullptr : settle(id);
  auto mark = detail::make_mark(marks_);  // recorded after the H2D copy
  std::unique_lock lock(mutex_);
  auto& c = slot(id);
  if (!c.where.has_value() && save_error) std::rethrow_exception(save_error);  // the save that was to make it failed
  SPILLWAY_EXPECTS(c.where.has_value(), "tier backing: tensor \"" + name + "\" has no copy to load");
  SPILLWAY_EXPECTS(c.bytes == bytes, "tier backing: tensor \"" + name + "\" has a copy of " + std::to_string(c.bytes) +
                                          " bytes, asked for " + std::to_string(bytes));
  auto state = new_state();
  move_handle handle(state, mark);
  counters_.h2d_bytes += bytes;
  c.in_flight.push_back(handle);  // keeps the copy it reads (Note [Retired copies])
  if (*c.where == tier::host) {
    void* block = c.host;
    lock.unlock();
    bool enqueued = false;
    try {
      copy_then_mark(dst, block, bytes, copy_kind::host_to_device, s, *mark, enqueued);
    } catch (...) {
      state->finish(std::current_exception());  // the host copy stays as it was
      throw;
    }
    state->finish(nullptr);
    return handle;
  }
  // NVMe -> staging (CRC-checked) -> device: the read's completion enqueues the H2D copy and
  // records the handle's event (Note [Moves without host functions]). When the read fails
  // nothing is copied and the handle says so: the executor checks NVMe loads before an op may
  // see them.
  counters_.nvme_read_bytes += bytes;
  const std::string file_name = c.nvme_name;
  lock.unlock();
  void* staging = staging_block(bytes);
  try {
    const auto t0 = std::chrono::steady_clock::now();
    (void)nvme_->read(file_name, staging, capacity_of(bytes),
                      [this, name, t0, dst, staging, bytes, s, mark, state](std::exception_ptr err) {
                        note_io(false, name, t0);
                        land(name, dst, staging, bytes, s, mark, state, std::move(err));
                      });
  } catch (...) {
    mark->abandon();
    free_staging(staging, bytes);
    state->finish(std::current_exception());
    throw;
  }
  return handle;
}

void tier_backing::land(const std::string& name, void* dst, void* staging, std::uint64_t bytes, stream s,
                        const std::shared_ptr<detail::device_mark>& mark,
                        const std::shared_ptr<detail::move_state>& state, std::exception_ptr err) {
  // On the I/O thread that finished the read: an ordinary thread, which may call the Device.
  bool copying = false;
  if (!err) {
    // The copy's span is for the timeline only: a device that will not time it costs the span.
    copy_span span;
    if (keep_spans_) {
      try {
        span = copy_span{name, std::make_shared<owned_event>(device_, true), std::make_shared<owned_event>(device_, true)};
        device_.record_event(*span.start, s);
      } catch (...) {
        span = copy_span{};
      }
    }
    // The span ends, and joins the list, before the mark: drain() returns once the mark is
    // reached, and end_iteration then times every span listed (an end recorded after the mark
    // might not be reached yet, and the GPU answers "not ready" to timing it).
    auto end_span = [&]() noexcept {
      if (!span.end) return;
      try {
        device_.record_event(*span.end, s);
        std::lock_guard lock(spans_mutex_);
        copy_spans_.push_back(std::move(span));
      } catch (...) {  // NOLINT(bugprone-empty-catch): the span is dropped, the copy stands
      }
    };
    try {
      copy_then_mark(dst, staging, bytes, copy_kind::host_to_device, s, *mark, copying, end_span);
    } catch (...) {
      err = std::current_exception();
    }
  }
  if (err) {
    mark->abandon();
    // else the device failed under the copy: leave it. A read that timed out may still land in
    // the block: it goes back once the kernel is done with it (Note [Hung completions]).
    if (!copying) nvme_->after_settled(staging, [this, staging, bytes] { free_staging(staging, bytes); });
    try {
      std::rethrow_exception(err);
    } catch (const corruption_error&) {
    } catch (const std::exception& e) {
      err = std::make_exception_ptr(io_error(std::string("reading a tensor from the NVMe tier failed: ") + e.what(), 0));
    } catch (...) {
    }
    state->finish(std::move(err));  // Note [Errors that cross threads]
    return;
  }
  // The staging block goes back once the copy out of it is done, on the worker thread.
  worker_.after(mark, [this, staging, bytes](std::exception_ptr) { free_staging(staging, bytes); });
  state->finish(nullptr);
}

// Note [Puts keep the old copy]
// put() replaces a tensor's tier copy with given bytes (a Session's write or load). The old copy
// stays until the new one is stored, so a put that fails (the tier full, the drive refusing a
// write) leaves the tensor its earlier value. A host copy of the same size is overwritten in
// place, which cannot fail and needs no second block; an NVMe copy is written anew under a fresh
// name, the old one erased after.
void tier_backing::put(tensor_id id, const std::string& name, const void* src, std::uint64_t bytes, tier to) {
  settle(id);
  std::unique_lock lock(mutex_);
  auto fill = [&](void* dst) {
    if (src != nullptr) std::memcpy(dst, src, bytes);
    else std::memset(dst, 0, bytes);
  };
  {
    auto& c = slot(id);
    if (c.where == tier::host && !c.staging && c.bytes == bytes && (to == tier::host || nvme_ == nullptr)) {
      fill(c.host);
      return;
    }
  }
  void* block = nullptr;
  if (to == tier::host || nvme_ == nullptr) {
    try {
      block = host_.allocate(name, bytes);
    } catch (const out_of_memory& e) {
      if (nvme_ == nullptr) throw no_room(e, name, bytes, "has nowhere to be stored");
    }
  }
  if (block != nullptr) {
    fill(block);
    auto& c = slot(id);
    free_copy(c);
    c.bytes = bytes;
    c.where = tier::host;
    c.host = block;
    return;
  }
  const std::string file_name = name + "#" + std::to_string(id) + "." + std::to_string(++generation_);
  lock.unlock();
  void* staging = staging_block(bytes);
  fill(staging);
  try {
    nvme_->write(file_name, staging, bytes, capacity_of(bytes)).wait();
  } catch (...) {
    free_staging(staging, bytes);  // a failed write keeps nothing, and the kernel only read it
    throw;
  }
  free_staging(staging, bytes);
  std::lock_guard relock(mutex_);
  auto& c = slot(id);
  free_copy(c);
  c.bytes = bytes;
  c.nvme_name = file_name;
  c.where = tier::nvme;
  counters_.nvme_write_bytes += bytes;
}

void tier_backing::get(tensor_id id, const std::string& name, void* dst, std::uint64_t bytes) {
  settle(id);
  std::unique_lock lock(mutex_);
  auto& c = slot(id);
  SPILLWAY_EXPECTS(c.where.has_value(), "tier backing: tensor \"" + name + "\" has no copy");
  if (*c.where == tier::host) {
    std::memcpy(dst, c.host, bytes);
    return;
  }
  const std::string file_name = c.nvme_name;
  lock.unlock();
  void* staging = staging_block(bytes);
  try {
    nvme_->read(file_name, staging, capacity_of(bytes)).wait();
  } catch (...) {
    // A read that timed out may still land in the block (Note [Hung completions]).
    nvme_->after_settled(staging, [this, staging, bytes] { free_staging(staging, bytes); });
    throw;
  }
  std::memcpy(dst, staging, bytes);
  free_staging(staging, bytes);
  std::lock_guard relock(mutex_);
  counters_.nvme_read_bytes += bytes;
}

void* tier_backing::host_copy(tensor_id id, const std::string& name, std::uint64_t bytes) {
  settle(id);
  std::unique_lock lock(mutex_);
  {
    auto& c = slot(id);
    if (c.where == tier::host) return c.host;
  }
  void* block = allocate_host(name, bytes, lock);
  auto& c = slot(id);
  if (c.where == tier::nvme) {
    const std::string file_name = c.nvme_name;
    lock.unlock();
    void* staging = staging_block(bytes);  // the file holds whole blocks: read into a block as long
    try {
      nvme_->read(file_name, staging, capacity_of(bytes)).wait();
    } catch (...) {
      nvme_->after_settled(staging, [this, staging, bytes] { free_staging(staging, bytes); });
      std::lock_guard relock(mutex_);
      host_.deallocate(block, bytes);
      throw;
    }
    std::memcpy(block, staging, bytes);
    free_staging(staging, bytes);
    lock.lock();
    counters_.nvme_read_bytes += bytes;
  }
  auto& now = slot(id);
  free_copy(now);
  now.where = tier::host;
  now.host = block;
  now.bytes = bytes;
  return block;
}

std::optional<tier> tier_backing::where(tensor_id id) const {
  std::lock_guard lock(mutex_);
  if (id >= copies_.size()) return std::nullopt;
  return copies_[id].where;
}

void tier_backing::discard(tensor_id id) {
  std::lock_guard lock(mutex_);
  free_settled();
  retire(slot(id));
}

void tier_backing::drain() {
  std::vector<move_handle> pending;
  {
    std::lock_guard lock(mutex_);
    for (auto& c : copies_) {
      for (auto& h : c.in_flight) pending.push_back(h);
      c.in_flight.clear();
    }
    for (auto& c : retired_)
      for (auto& h : c.in_flight) pending.push_back(h);
  }
  for (auto& h : pending) wait_quietly(h);
  worker_.drain();  // the staging frees that follow the copies
  std::lock_guard lock(mutex_);
  free_all_settled();
}

backing_counters tier_backing::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

}  // namespace spillway
