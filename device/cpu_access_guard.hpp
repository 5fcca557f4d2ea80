// The cpu backend's debug mode for host access to device memory (device_options::debug_host_access):
// an arena that is readable only while stream work of its device runs. See Note [Debug host access].
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace spillway::detail {

/// The device memory of a cpu_device in debug_host_access mode: one private anonymous mapping,
/// PROT_NONE while no stream work of the device runs and readable and writable while any does
/// (a count of access scopes: the first one in unprotects it, the last one out protects it
/// again). A host access from any other thread then faults, and a SIGSEGV handler installed
/// with the first arena says so on stderr before the process dies.
///
/// Allocation bookkeeping lives outside the mapping, so that allocate and deallocate never
/// touch device memory. The mapping reserves more address space than the capacity (it costs no
/// memory until touched) so that fragmentation does not make allocations fail that the
/// capacity allows; the capacity itself is accounted by the caller.
class guarded_arena {
 public:
  /// Maps and protects the arena; throws out_of_memory when the address space cannot be had.
  explicit guarded_arena(std::size_t capacity);
  ~guarded_arena();
  guarded_arena(const guarded_arena&) = delete;
  guarded_arena& operator=(const guarded_arena&) = delete;

  /// `bytes` (a multiple of `alignment`, itself a power of two up to a page) from the arena, or
  /// nullptr when no free range is large enough.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) noexcept;
  /// Gives back a range allocate handed out; its whole pages go back to the system.
  void deallocate(void* p, std::size_t bytes) noexcept;
  [[nodiscard]] bool contains(const void* p) const noexcept;

  /// Opens and closes an access scope (the caller runs stream work in between).
  void enter() noexcept;
  void leave() noexcept;

  /// An access scope for the lifetime of the object; a null arena makes it a no-op.
  class access {
   public:
    explicit access(guarded_arena* a) noexcept : arena_(a) {
      if (arena_ != nullptr) arena_->enter();
    }
    ~access() {
      if (arena_ != nullptr) arena_->leave();
    }
    access(const access&) = delete;
    access& operator=(const access&) = delete;

   private:
    guarded_arena* arena_;
  };

 private:
  void protect(int prot) noexcept;

  std::uintptr_t base_ = 0;
  std::size_t span_ = 0;  // bytes mapped
  int slot_ = -1;         // in the fault handler's table of arenas; -1: not registered

  std::mutex access_mutex_;
  std::size_t inside_ = 0;  // open access scopes (under access_mutex_)

  std::mutex free_mutex_;
  std::map<std::uintptr_t, std::size_t> free_;  // start -> bytes, coalesced (under free_mutex_)
};

}  // namespace spillway::detail
