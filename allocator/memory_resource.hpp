// The memory resource interface of device allocators (RMM style): the device itself and the arena.
// Public non-virtual allocate/deallocate check their input once and call private do_* hooks.
//
// Stream contract (written once, here; every resource follows it):
//  * allocate(bytes, s) returns memory that is valid for work enqueued on stream s after the
//    call. Work on another stream must first be ordered after s (an event), as with any data.
//  * deallocate(p, bytes, s) names s, the stream of last use: every use of p is enqueued on s,
//    or ordered before work on s, at the time of the call. The resource may hand p out again to
//    s at once (stream order makes that safe), and to any other stream only once an event
//    recorded on s shows that the work is done (see Note [Arena handoff] in arena_allocator.hpp).
//  * bytes passed to deallocate are the bytes passed to allocate; p == nullptr is a no-op.
//  * A null stream (stream{}) in deallocate means "no work on the device uses p any more".
//  * Streams handed to a resource must outlive it (or, for the arena, be passed to
//    forget_stream first): a resource may record events on them until it is destroyed.
//  * Memory is aligned to at least 256 bytes. A request of 0 bytes, or of more than
//    spillway::max_size_bytes, is a config_error quoting the size; a request no memory can
//    serve is an out_of_memory whose message says why.
#pragma once

#include <cstddef>

#include "device/device.hpp"
#include "device/interface.hpp"
#include "device/units.hpp"

namespace spillway {

/// Alignment every device memory resource guarantees (as cudaMalloc does).
inline constexpr std::size_t device_memory_alignment = 256;

namespace detail {
/// Throws config_error for a request of 0 bytes or above max_size_bytes, quoting it.
[[noreturn, gnu::cold]] void throw_bad_request_size(std::size_t bytes, const char* who);
inline void check_request_size(std::size_t bytes, const char* who) {
  if (bytes == 0 || bytes > max_size_bytes) [[unlikely]] throw_bad_request_size(bytes, who);
}
}  // namespace detail

class device_memory_resource : public abstract_interface {
 public:
  /// At least `bytes` bytes of device memory valid on stream `s`; see the contract above.
  [[nodiscard]] void* allocate(std::size_t bytes, stream s) {
    detail::check_request_size(bytes, name());
    return do_allocate(bytes, s);
  }

  /// Returns memory from allocate(bytes, ...); `s` is the stream of last use.
  void deallocate(void* ptr, std::size_t bytes, stream s) noexcept {
    if (ptr != nullptr) do_deallocate(ptr, bytes, s);
  }

  /// A short name for messages ("device", "arena allocator").
  [[nodiscard]] virtual const char* name() const noexcept = 0;

 private:
  virtual void* do_allocate(std::size_t bytes, stream s) = 0;
  virtual void do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept = 0;
};

}  // namespace spillway
