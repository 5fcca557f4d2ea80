// The caching allocator's free-list policy: best fit per stream, split, coalesce.
// Blocks and index nodes come from a pool resource, so reuse of a cached block never mallocs.
#include "allocator/block_pool.hpp"

#include <algorithm>
#include <cassert>
#include <functional>
#include <string>

#include "device/error.hpp"

namespace spillway::detail {

bool block_pool::order::operator()(const block* a, const block* b) const noexcept {
  const auto sa = reinterpret_cast<std::uintptr_t>(a->stream), sb = reinterpret_cast<std::uintptr_t>(b->stream);
  if (sa != sb) return sa < sb;
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}

block_pool::block_pool(std::size_t min_split) : min_split_(min_split), free_(&memory_) {}

block_pool::~block_pool() {
  for (segment* s : segments_) {
    for (block* b = s->first; b != nullptr;) {
      block* next = b->next;
      delete_block(b);
      b = next;
    }
    delete s;
  }
  for (block* b : spare_blocks_) {
    b->~block();
    memory_.deallocate(b, sizeof(block), alignof(block));
  }
}

block* block_pool::new_block() {
  if (!spare_blocks_.empty()) {
    block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    *b = block{};
    return b;
  }
  return new (memory_.allocate(sizeof(block), alignof(block))) block{};
}

void block_pool::delete_block(block* b) { spare_blocks_.push_back(b); }

void block_pool::insert_free(block* b) {
  b->state = block_state::free;
  free_.insert(b);
  free_bytes_ += b->size;
}

void block_pool::erase_free(block* b) {
  [[maybe_unused]] const auto n = free_.erase(b);
  assert(n == 1);
  free_bytes_ -= b->size;
}

block* block_pool::best_fit(void* stream, std::size_t size) const {
  block probe;
  probe.size = size;
  auto first_fit_on = [&](void* s) -> block* {
    probe.stream = s;
    auto it = free_.lower_bound(&probe);
    return it != free_.end() && (*it)->stream == s ? *it : nullptr;
  };
  block* own = stream != nullptr ? first_fit_on(stream) : nullptr;
  block* any = first_fit_on(nullptr);
  if (own == nullptr) return any;
  if (any == nullptr) return own;
  return any->size < own->size ? any : own;
}

block* block_pool::take(block* b, std::size_t size, std::size_t requested, void* stream) {
  assert(b->state == block_state::free && b->size >= size);
  erase_free(b);
  if (b->size - size >= min_split_) {
    block* rest = new_block();
    rest->address = b->address + size;
    rest->size = b->size - size;
    rest->stream = b->stream;
    rest->seg = b->seg;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    insert_free(rest);
  }
  b->state = block_state::live;
  b->requested = requested;
  b->stream = stream;
  ++b->seg->busy_blocks;
  return b;
}

block* block_pool::add_segment(std::uintptr_t address, std::size_t size, void* stream) {
  auto* s = new segment{address, size, stream, 0, nullptr, this};
  block* b = new_block();
  b->address = address;
  b->size = size;
  b->stream = nullptr;  // fresh memory: no stream has used it
  b->seg = s;
  s->first = b;
  segments_.push_back(s);
  insert_free(b);
  return b;
}

block* block_pool::merge(block* left, block* right) {
  // Both free (already out of the index) and on the same stream; `right` disappears.
  left->size += right->size;
  left->next = right->next;
  if (right->next != nullptr) right->next->prev = left;
  delete_block(right);
  return left;
}

void block_pool::release(block* b, void* stream) {
  assert(b->state != block_state::free);
  --b->seg->busy_blocks;
  b->stream = stream;
  b->requested = 0;
  // A neighbour free on any stream may join a block free on `stream` (that only narrows who
  // may use it until the next handoff); blocks free on two different streams never merge.
  auto joins = [stream](const block* n) {
    return n != nullptr && n->state == block_state::free && (n->stream == stream || n->stream == nullptr);
  };
  // Loops: past a neighbour free on any stream may lie one free on `stream`.
  while (joins(b->next)) {
    erase_free(b->next);
    b = merge(b, b->next);
  }
  while (joins(b->prev)) {
    block* prev = b->prev;
    erase_free(prev);
    b = merge(prev, b);
  }
  b->stream = stream;
  insert_free(b);
}

bool block_pool::others_hold(void* stream, std::size_t size) const {
  for (auto it = free_.rbegin(); it != free_.rend();) {
    // Walk streams from the back: each stream's largest block is the last of its range.
    block* largest = *it;
    if (largest->stream == nullptr) return false;  // null sorts first: no more streams
    if (largest->stream != stream && largest->size >= size) return true;
    block probe;
    probe.stream = largest->stream;
    it = std::make_reverse_iterator(free_.lower_bound(&probe));
  }
  return false;
}

std::vector<void*> block_pool::owning_streams() const {
  std::vector<void*> out;
  block probe;
  for (auto it = free_.begin(); it != free_.end();) {
    if ((*it)->stream != nullptr) out.push_back((*it)->stream);
    probe.stream = (*it)->stream;
    probe.size = static_cast<std::size_t>(-1);
    probe.address = static_cast<std::uintptr_t>(-1);
    it = free_.upper_bound(&probe);
  }
  return out;
}

void block_pool::make_pending(void* stream, std::vector<block*>& out) {
  block probe;
  probe.stream = stream;
  auto it = free_.lower_bound(&probe);
  while (it != free_.end() && (*it)->stream == stream) {
    block* b = *it;
    free_bytes_ -= b->size;
    it = free_.erase(it);
    b->state = block_state::pending;
    ++b->seg->busy_blocks;
    out.push_back(b);
  }
}

void block_pool::settle(block* b) {
  assert(b->state == block_state::pending);
  release(b, nullptr);
}

std::vector<block_pool::released_segment> block_pool::remove_free_segments(void* also) {
  std::vector<released_segment> out;
  std::erase_if(segments_, [&](segment* s) {
    block* b = s->first;
    if (s->busy_blocks != 0 || b->next != nullptr || (b->stream != nullptr && b->stream != also)) return false;
    erase_free(b);
    out.push_back({s->address, s->size, b->stream});
    delete_block(b);
    delete s;
    return true;
  });
  return out;
}

std::size_t block_pool::largest_free() const {
  std::size_t best = 0;
  for (const block* b : free_) best = std::max(best, b->size);  // slow path only (diagnosis)
  return best;
}

void block_pool::check_invariants() const {
  auto fail = [](const std::string& what) { throw error("caching allocator invariant broken: " + what); };
  std::size_t free_seen = 0, free_bytes = 0;
  for (const segment* s : segments_) {
    std::uintptr_t at = s->address;
    std::size_t busy = 0;
    const block* prev = nullptr;
    for (const block* b = s->first; b != nullptr; prev = b, b = b->next) {
      if (b->address != at) fail("blocks do not tile a segment");
      if (b->prev != prev || b->seg != s) fail("a block's links are wrong");
      if (b->size == 0) fail("an empty block");
      if (b->state == block_state::free) {
        if (!free_.contains(const_cast<block*>(b))) fail("a free block is missing from the index");
        if (prev != nullptr && prev->state == block_state::free && prev->stream == b->stream)
          fail("two neighbouring free blocks on the same stream were not merged");
        ++free_seen;
        free_bytes += b->size;
      } else {
        ++busy;
      }
      at += b->size;
    }
    if (at != s->address + s->size) fail("blocks do not cover a segment");
    if (busy != s->busy_blocks) fail("a segment's busy count is wrong");
  }
  if (free_seen != free_.size()) fail("the free index holds blocks that are not free");
  if (free_bytes != free_bytes_) fail("free byte count is wrong");
}

}  // namespace spillway::detail
