// tensor_backing: where the executor keeps the off-device copy of each tensor (host or NVMe
// tier) and how bytes move between that copy and device memory, in stream order.
// The swap-tier implementation lives in prefetch/tier_backing.*; tests wrap it to inject faults.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "prefetch/plan.hpp"
#include "swap/move_handle.hpp"

namespace spillway {

/// One NVMe transfer of a tensor's copy, for timelines.
struct io_span {
  bool write = false;  ///< to the NVMe tier (else from it)
  std::string name;
  std::chrono::steady_clock::time_point start, end;
};

/// A copy that the backing enqueued on its own (an NVMe load's H2D copy, enqueued when the read
/// completes), bracketed by timing events, for timelines. The events are recorded on the copy's
/// stream; read them (Device::elapsed_ms) after that stream is synchronised.
struct copy_span {
  std::string name;
  std::shared_ptr<owned_event> start, end;
};

struct backing_counters {
  std::uint64_t h2d_bytes = 0;         ///< SUM of bytes copied host -> device
  std::uint64_t d2h_bytes = 0;         ///< SUM of bytes copied device -> host
  std::uint64_t nvme_read_bytes = 0;   ///< SUM of bytes read from the NVMe tier
  std::uint64_t nvme_write_bytes = 0;  ///< SUM of bytes written to the NVMe tier
};

class tensor_backing {
 public:
  virtual ~tensor_backing() = default;

  /// Copies `bytes` bytes of device memory at `src` into tensor `id`'s copy in tier `to` (host
  /// or nvme; where that tier has no room the other one is used), replacing any older copy.
  /// The device read is enqueued on `s` after the work already there, so the caller may free
  /// `src` in stream order on `s` at once. The returned handle is ready when the copy is
  /// complete in its tier; if writing to NVMe fails the bytes stay on the host and the handle
  /// carries the io_error naming the tensor.
  virtual move_handle save(tensor_id id, const std::string& name, const void* src, std::uint64_t bytes, tier to,
                           stream s) = 0;
  /// Copies tensor `id`'s tier copy into device memory `dst` with an H2D copy on `s`. The handle
  /// is ready when the bytes are on the device, and carries the io_error (e.g. a checksum
  /// mismatch) when they could not be read: then `dst` is untouched. Where the handle has a
  /// device event (move_handle::has_device_event), it is recorded right after the copy, which
  /// may be enqueued after load() returns (a load from NVMe: once the read is verified), so
  /// consumers wait with move_handle::stream_wait; a handle without one means the copy was
  /// enqueued on `s` before load() returned. No implementation may wait in a host function.
  virtual move_handle load(tensor_id id, const std::string& name, void* dst, std::uint64_t bytes, stream s) = 0;
  /// Stores host bytes as tensor `id`'s tier copy (initial values), synchronously. One that
  /// throws leaves the earlier copy as it was.
  virtual void put(tensor_id id, const std::string& name, const void* host, std::uint64_t bytes, tier to) = 0;
  /// Reads tensor `id`'s tier copy into host memory, synchronously (throws io_error on failure).
  virtual void get(tensor_id id, const std::string& name, void* host, std::uint64_t bytes) = 0;
  /// The host-tier bytes of tensor `id`'s copy, for an op that runs on the host (Note [Host ops]
  /// in prefetch/plan.hpp), once the moves in flight on it have finished: a copy in the NVMe tier
  /// is read into the host tier first (and leaves NVMe), and a tensor with no copy gets an
  /// uninitialised host-tier block of `bytes`. The host op reads and writes it in place; a later
  /// load() copies what it left. Valid until the next save, put or discard of `id`. Throws
  /// out_of_memory when the host tier has no room, io_error when the NVMe read fails (the copy
  /// stays there).
  [[nodiscard]] virtual void* host_copy(tensor_id id, const std::string& name, std::uint64_t bytes) = 0;
  /// The tier holding tensor `id`'s copy, if any.
  [[nodiscard]] virtual std::optional<tier> where(tensor_id id) const = 0;
  /// Drops tensor `id`'s tier copy once the moves in flight on it have finished.
  virtual void discard(tensor_id id) = 0;
  /// Waits for every move in flight.
  virtual void drain() = 0;
  [[nodiscard]] virtual backing_counters counters() const = 0;
  /// Starts or stops keeping each NVMe transfer's start and end (off by default).
  virtual void keep_io_spans(bool on) { (void)on; }
  /// The NVMe transfers that ended since the last call, while keep_io_spans was on.
  [[nodiscard]] virtual std::vector<io_span> take_io_spans() { return {}; }
  /// The copies the backing enqueued itself since the last call, while keep_io_spans was on.
  [[nodiscard]] virtual std::vector<copy_span> take_copy_spans() { return {}; }
};

}  // namespace spillway
