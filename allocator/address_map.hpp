// A flat hash map from block address to block, for the caching allocator's deallocate path.
// Open addressing with linear probing and backward-shift deletion: no allocation per insert.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace spillway::detail {

template <class V>
class address_map {
 public:
  address_map() { slots_.resize(1024); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// Inserts key (not 0, not present) -> value.
  void insert(std::uintptr_t key, V value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(key, value);
    ++size_;
  }

  /// The value of `key`, or V{} when absent.
  [[nodiscard]] V find(std::uintptr_t key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) return slots_[i].value;
      if (slots_[i].key == 0) return V{};
    }
  }

  /// Removes `key` and returns its value, or V{} when absent.
  V erase(std::uintptr_t key) noexcept {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask()) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return V{};
    }
    V out = slots_[i].value;
    // Backward shift: pull later entries of the probe run into the hole.
    for (std::size_t j = (i + 1) & mask();; j = (j + 1) & mask()) {
      if (slots_[j].key == 0) break;
      const std::size_t h = home(slots_[j].key);
      // Move j into the hole at i unless its home lies cyclically in (i, j].
      if (((j - h) & mask()) >= ((j - i) & mask())) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = slot{};
    --size_;
    return out;
  }

  template <class F>
  void for_each(F&& f) const {
    for (const auto& s : slots_)
      if (s.key != 0) f(s.key, s.value);
  }

 private:
  struct slot {
    std::uintptr_t key = 0;
    V value{};
  };
  [[nodiscard]] std::size_t mask() const noexcept { return slots_.size() - 1; }
  [[nodiscard]] std::size_t home(std::uintptr_t key) const noexcept {
    // Addresses are multiples of 512: drop those bits, then a Fibonacci hash.
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ULL) >> (64 - std::countr_zero(slots_.size())));
  }
  void place(std::uintptr_t key, V value) noexcept {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = slot{key, value};
  }
  void grow() {
    std::vector<slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const auto& s : old)
      if (s.key != 0) place(s.key, s.value);
  }

  std::vector<slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace spillway::detail
