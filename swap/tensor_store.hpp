// tensor_store: where each named tensor's bytes live (device, host tier, NVMe tier) and the
// asynchronous moves between them. The executor (prefetch/) drives swapping through this.
//
// Ownership. Device memory belongs to the caller (its caching allocator and budget): the
// store records the pointer while a tensor is on the device, copies from it when the tensor
// leaves, and copies into the pointer the caller gives when it comes back. Host-tier blocks,
// staging buffers and NVMe blocks belong to the store.
//
// Moves. Each returns a move_handle at once; the bytes move in the background:
//   to_host(name, s)        device -> host   D2H copy on stream s
//                           nvme   -> host   io_uring read, CRC-checked
//   to_nvme(name, s)        host   -> nvme   io_uring write from the host block itself
//                           device -> nvme   D2H on s into a pinned staging block, then write
//   to_device(name, dst, s) host   -> device H2D copy on s into dst
//                           nvme   -> device read into a staging block, then H2D on s, enqueued
//                                             when the read completes: order later work on s
//                                             (or any stream) after it with stream_wait
// A tensor already at the destination gets a handle that is ready at once.
//
// Source release (invariant 3 of DESIGN.md). A move's source copy is released only after its
// destination is complete and verified, and before the handle becomes ready. On failure the
// tensor stays where it was, readable, and the handle's error (io_error, corruption_error or
// out_of_memory) names it. When a tensor leaves the device, the caller may free its device
// memory once the handle is ready without error (or stream-ordered on s right away for
// to_host, since the copy is ordered on s; not for to_nvme, which may fail after the copy).
//
// One move per tensor at a time: starting a move, remove() or reading a pointer of a tensor
// that is moving throws spillway::error. Different tensors move concurrently, on any streams,
// from any threads. The store, its host tier and NVMe tier must outlive every move; the
// destructor waits for moves in flight.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "device/device.hpp"
#include "swap/event_worker.hpp"
#include "swap/host_tier.hpp"
#include "swap/move_handle.hpp"
#include "swap/nvme_tier.hpp"
#include "swap/tier.hpp"

namespace spillway {


class tensor_store {
 public:
  /// `nvme` may be null: then only device <-> host moves are possible.
  tensor_store(Device& device, host_tier& host, nvme_tier* nvme = nullptr);
  ~tensor_store();
  tensor_store(const tensor_store&) = delete;
  tensor_store& operator=(const tensor_store&) = delete;

  /// Registers a tensor whose bytes are on the device at `device_ptr` (the caller's memory).
  void add_on_device(const std::string& name, std::size_t bytes, void* device_ptr);
  /// Registers a tensor on the host tier and returns its (pinned) block for the caller to
  /// fill before the first move. Throws out_of_memory when the host tier is full.
  [[nodiscard]] void* add_on_host(const std::string& name, std::size_t bytes);
  /// Forgets a tensor: frees its host block or NVMe blocks (its device memory stays the
  /// caller's). Throws when it is moving.
  void remove(const std::string& name);

  [[nodiscard]] bool contains(const std::string& name) const;
  [[nodiscard]] tier where(const std::string& name) const;
  [[nodiscard]] bool moving(const std::string& name) const;
  [[nodiscard]] std::size_t bytes(const std::string& name) const;
  /// The device pointer while the tensor is on the device (else null).
  [[nodiscard]] void* device_ptr(const std::string& name) const;
  /// The host-tier block while the tensor is on the host (else null).
  [[nodiscard]] void* host_ptr(const std::string& name) const;

  move_handle to_host(const std::string& name, stream s);
  move_handle to_nvme(const std::string& name, stream s);
  move_handle to_device(const std::string& name, void* dst, stream s);

  /// Blocks until no move is in flight.
  void wait_idle();

  [[nodiscard]] Device& device() const noexcept { return device_; }
  [[nodiscard]] host_tier& host() const noexcept { return host_; }
  [[nodiscard]] nvme_tier* nvme() const noexcept { return nvme_; }

 private:
  struct entry {
    std::size_t bytes = 0;
    tier where = tier::device;
    bool moving = false;
    void* device = nullptr;
    void* host = nullptr;
  };

  entry& begin_move(const std::string& name);  // under mutex_: checks and marks moving
  void end_move(const std::string& name, tier where, void* device, void* host,
                const std::shared_ptr<detail::move_state>& state, std::exception_ptr error) noexcept;
  void abort_move(const std::string& name) noexcept;
  [[nodiscard]] const entry& find(const std::string& name) const;  // under mutex_
  nvme_tier& need_nvme(const std::string& name) const;
  static move_handle ready_handle();

  Device& device_;
  host_tier& host_;
  nvme_tier* nvme_;
  mutable std::mutex mutex_;
  std::condition_variable idle_cv_;
  std::unordered_map<std::string, entry> tensors_;
  std::uint64_t in_flight_ = 0;
  std::shared_ptr<event_pool> marks_;  // the events of this mover's device marks
  event_worker worker_;  // last: its jobs use the members above, and it is joined first
};

}  // namespace spillway
