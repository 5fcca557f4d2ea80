// The device budget: how many bytes of device memory Spillway may hold, and the one rule for the
// room kept around a plan (Note [Headroom]). The arena reserves it, the executor keeps tensors and
// scratch within it, fit_plan plans under it, and the Session changes it; nothing else rounds,
// splits or shrinks it.
#pragma once

#include <cstdint>

#include "device/device.hpp"

namespace spillway {

// Note [Headroom]
// The budget is every device byte Spillway holds. The arena (arena_allocator.hpp) reserves
// exactly it, and everything Spillway puts on the device is carved from there: tensors (the
// examples register library workspaces as tensors of kind workspace, so the planner counts them)
// and per-op scratch (Session::op_scope::workspace), which is allocated when its op runs and
// makes room, like any allocation, by evicting tensors the op does not use. Room is left in two
// places and no others:
//  1. Beside the budget, only when none is given (of_free_memory): on a GPU, 1/16 of the free
//     memory stays free for what allocates outside Spillway (the CUDA context as it grows, the
//     cuBLAS and cuDNN handles, other processes). The cpu backend's device is the Session's own.
//  2. Under the budget, for scratch and packing. A Session's first plan (no_margin) is made for
//     the whole budget less the most scratch one op held beside its tensors in the recorded
//     iteration (executor::scratch, gathered views), and kept only when its packed layout ends
//     below that, leaving the scratch its room at the top of the arena (or, where the plan at the
//     margin below packs, one made between the two that packs there: Note [Above the margin] in
//     offload/fit_plan.cpp). Otherwise, and after an iteration of that plan still had to evict on
//     demand, a plan is made for the budget less a packing margin (planning_bytes): 1/32 of it,
//     doubled for each further planned iteration that had to evict on demand, at most 1/4. The
//     margin is room for make_layout's packing, the granule's rounding and the scratch; fit_plan
//     lowers the planning budget below it only while the packed layout still overshoots.
// The auto planner's sweep reserves (planner_options::auto_sweep_reserves) are not headroom: they
// are a search over eviction limits within the planning budget.
class device_budget {
 public:
  /// Every device block is a multiple of this (the arena's granule, the layout's rounding).
  static constexpr std::uint64_t granule = 512;
  /// Doublings of the packing margin after which it stops growing (1/32 -> 1/4).
  static constexpr int max_margin_doublings = 3;
  /// The step before the first doubling: no margin, the whole budget less the ops' scratch
  /// (Note [Headroom], 2; fit_plan). planning_bytes reads it as no doublings.
  static constexpr int no_margin = -1;

  constexpr device_budget() = default;
  explicit constexpr device_budget(std::uint64_t bytes) noexcept : bytes_(bytes) {}
  /// The budget when none is given: the device's free memory (Note [Headroom], 1), rounded down to
  /// the granule.
  [[nodiscard]] static device_budget of_free_memory(Device& device);

  [[nodiscard]] constexpr std::uint64_t bytes() const noexcept { return bytes_; }
  /// True when `more` bytes can join `in_use` within the budget.
  [[nodiscard]] constexpr bool admits(std::uint64_t in_use, std::uint64_t more) const noexcept {
    return in_use + more <= bytes_;
  }
  /// Device bytes a tensor of `bytes` takes once placed: rounded up to the granule.
  [[nodiscard]] static constexpr std::uint64_t placed(std::uint64_t bytes) noexcept {
    return (bytes + granule - 1) / granule * granule;
  }
  /// The budget a plan is made for after `doublings` of the packing margin (Note [Headroom], 2).
  [[nodiscard]] constexpr std::uint64_t planning_bytes(int doublings) const noexcept {
    const int d = doublings < 0 ? 0 : doublings > max_margin_doublings ? max_margin_doublings : doublings;
    return bytes_ - bytes_ / 32 * (std::uint64_t{1} << d) - bytes_ % 32 * (std::uint64_t{1} << d) / 32;
  }
  /// Throws config_error when the budget is 0 or more than `device` has, naming both and what
  /// would fit.
  void check_fits(const Device& device) const;

  friend constexpr bool operator==(device_budget, device_budget) = default;

 private:
  std::uint64_t bytes_ = 0;
};

}  // namespace spillway
