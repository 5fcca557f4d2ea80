// The executor's placement of device memory: an op's tensors and scratch within the budget,
// evicting what is used farthest ahead to make room, and the free memory made whole again when
// it is in pieces (Note [Misses] in executor.cpp).
#include <algorithm>
#include <chrono>
#include <string>

#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_state.hpp"

namespace spillway {

bool executor::evict_one(std::uint64_t /*needed*/) {
  tensor_id victim = 0;
  std::uint64_t best = 0;
  bool found = false;
  for (tensor_id id = 0; id < tensors_.size(); ++id) {
    const auto& t = tensors_[id];
    if (!t || t->dev == nullptr) continue;
    if (std::find(pinned_.begin(), pinned_.end(), id) != pinned_.end()) continue;
    const std::uint64_t nu = next_use(id);
    if (!found || nu > best) {
      best = nu;
      victim = id;
      found = true;
    }
  }
  if (!found) return false;
  evict(victim, options_.spill_tier, /*on_demand=*/true);
  return true;
}

void* executor::allocate_for(tensor_id id, stream s, bool may_evict) {
  auto& st = state(id);
  const std::uint64_t bytes = st.desc.bytes;
  if (layout_ && !best_fit_only_ && budget().admits(in_use_, bytes)) {
    const auto at = layout_->offset(id, alloc_slot_);
    if (void* p = at ? arena_->try_allocate_at(*at, bytes, s) : nullptr) {
      in_use_ += bytes;
      note_memory();
      return p;
    }
    ++stats_.layout_misses;  // no address planned here, or it is taken: the run left the plan
  }
  return allocate_bytes(bytes, s, may_evict, &st);
}

// Best fit within the budget for tensor `for_tensor` (one of the op's own) or, when null, for the
// op's scratch; with `may_evict`, evicts (farthest next use first) and waits for the copy streams
// until it fits, and throws out_of_memory only when the op's own tensors and scratch fill it.
void* executor::allocate_bytes(std::uint64_t bytes, stream s, bool may_evict, const tensor_state* for_tensor) {
  auto from_arena = [&]() -> void* {
    // Scratch from the top of the arena, away from the addresses a layout plans (the bottom).
    if (for_tensor == nullptr) return arena_->try_allocate_high(bytes, s);
    try {
      return arena_->allocate(bytes, s);
    } catch (const out_of_memory&) {
      return nullptr;
    }
  };
  bool waited = false;
  for (;;) {
    if (budget().admits(in_use_, bytes)) {
      if (void* p = from_arena()) {
        in_use_ += bytes;
        note_memory();
        return p;
      }
      ++stats_.fragmented_allocations;  // no free run long enough: fragments
    }
    if (!may_evict) return nullptr;
    if (evict_one(bytes)) continue;
    if (!waited) {
      const auto t0 = std::chrono::steady_clock::now();
      synchronize_streams();
      host_stall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      waited = true;
      continue;
    }
    std::vector<tensor_id> own = pinned_;
    std::sort(own.begin(), own.end());
    own.erase(std::unique(own.begin(), own.end()), own.end());
    std::uint64_t pinned_bytes = 0;
    // Each as placed (rounded to the granule), so the hinted budget is one that fits them.
    for (auto t : own) pinned_bytes += device_budget::placed(tensors_[t]->desc.bytes);
    for (const auto& sc : scratch_) pinned_bytes += device_budget::placed(sc.second);
    if (for_tensor == nullptr) pinned_bytes += device_budget::placed(bytes);  // a tensor of the op is among pinned_ already
    const std::string what = for_tensor != nullptr ? "tensor \"" + for_tensor->desc.name + "\"" : std::string("scratch");
    if (for_tensor == nullptr && budget().admits(in_use_, bytes))
      throw out_of_memory("executor: op " + std::to_string(current_op_) + " (\"" + current_name_ + "\") needs scratch (" +
                          format_bytes(bytes) + "); the budget has room for it (" + format_bytes(in_use_) + " of " +
                          format_bytes(budget().bytes()) + " in use, by the op's own tensors and scratch) but not in "
                          "one piece, since the op's tensors, placed before it was asked for, split the free memory; "
                          "ask for it when the op begins, or make it a transient tensor of kind workspace that the "
                          "op writes, which is placed with the op's tensors");
    throw out_of_memory("executor: op " + std::to_string(current_op_) + " needs " + what + " (" + format_bytes(bytes) +
                        ") but " + format_bytes(in_use_) + " of the " + format_bytes(budget().bytes()) +
                        " budget is held by this op's own tensors and scratch or cannot be reused; they need " +
                        format_bytes_at_least(pinned_bytes) +
                        " in all, this one included: raise the device budget to at least that");
  }
}

// An op's or a rerun's tensors (and the op's scratch asked for at begin_op), on the device. Where
// everything else has left and they still do not fit together, the free memory is in pieces:
// everything goes, the pinned tensors too (a rerun's values made earlier in its step come back
// when read), the cache is handed back, and they are placed again, best fit, into whole memory.
void executor::place_op_tensors(std::span<const tensor_id> reads, std::span<const tensor_id> writes,
                                std::span<const std::uint64_t> scratch) {
  const std::size_t first_scratch = scratch_.size();
  auto place = [&] {
    for (auto id : reads) fetch(id, true);  // no-op when resident
    for (auto id : writes) {
      auto& st = state(id);
      if (st.dev == nullptr) {
        st.dev = allocate_for(id, compute_, /*may_evict=*/true);
        st.dev_valid = false;
      }
    }
    for (auto b : scratch) scratch_.emplace_back(allocate_bytes(b, compute_, /*may_evict=*/true, nullptr), b);
  };
  try {
    place();
  } catch (const out_of_memory&) {
    for (std::size_t i = first_scratch; i < scratch_.size(); ++i) {  // placed again below, with the rest
      arena_->deallocate(scratch_[i].first, scratch_[i].second, compute_);
      in_use_ -= scratch_[i].second;
    }
    scratch_.resize(first_scratch);
    defragment();
    // Best fit into the whole memory: the layout's addresses, planned without the op's scratch,
    // may be what split it.
    best_fit_only_ = true;
    struct best_fit {
      bool& on;
      ~best_fit() { on = false; }
    } guard{best_fit_only_};
    place();
  }
}

void executor::defragment() {
  const auto t0 = std::chrono::steady_clock::now();
  const auto keep = pinned_;
  pinned_.clear();
  for (tensor_id id = 0; id < tensors_.size(); ++id)
    if (tensors_[id] && tensors_[id]->dev != nullptr) evict(id, options_.spill_tier, /*on_demand=*/true);
  synchronize_streams();
  backing_->drain();
  pinned_ = keep;
  host_stall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace spillway
