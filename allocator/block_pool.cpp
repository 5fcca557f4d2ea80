// The caching allocator's free-list policy: best fit per stream, split, coalesce.
// Blocks come from chunks and free lists are intrusive, so reuse of a cached block never mallocs.
#include "allocator/block_pool.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <functional>
#include <string>

#include "device/error.hpp"

namespace spillway::detail {

// Note [Size classes]
// Sizes are multiples of 512. A size's class is its power of two and the next three bits below
// the leading one, so a class spans 1/8 of its power of two (512..575 B, ..., 1 GiB..1.125 GiB).
// best fit: scan the request's own class for the smallest block that fits, else take the
// smallest of the first few blocks of the next non-empty class (any of them fits). That is
// exact best fit within a class and bounds the waste of a pick by one class (12.5%), which the
// split then returns to the free lists.
block_pool::block_pool(std::size_t min_split) : min_split_(min_split) {
  bins_.push_back(std::make_unique<bins>());
  any_bins_ = bins_.back().get();
}

block_pool::~block_pool() {
  for (segment* s : segments_) delete s;
}

block* block_pool::new_block() {
  if (spare_blocks_.empty()) {
    constexpr std::size_t chunk = 256;
    block_chunks_.push_back(std::make_unique<block[]>(chunk));
    for (std::size_t i = chunk; i-- > 0;) spare_blocks_.push_back(&block_chunks_.back()[i]);
  }
  block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  b->requested = 0;  // callers set the rest; insert_free sets state and list links
  return b;
}

void block_pool::delete_block(block* b) { spare_blocks_.push_back(b); }

block_pool::bins* block_pool::find_bins(void* stream) const noexcept {
  if (stream == nullptr) return any_bins_;
  if (last_bins_ != nullptr && last_bins_->stream == stream) return last_bins_;
  for (const auto& b : bins_) {
    if (b->stream == stream) {
      last_bins_ = b.get();
      return b.get();
    }
  }
  return nullptr;
}

block_pool::bins& block_pool::bins_for(void* stream) {
  if (bins* b = find_bins(stream)) return *b;
  bins_.push_back(std::make_unique<bins>());
  bins_.back()->stream = stream;
  last_bins_ = bins_.back().get();
  return *bins_.back();
}

void block_pool::insert_free(block* b) {
  b->state = block_state::free;
  bins& bn = bins_for(b->stream);
  const std::size_t c = class_of(b->size);
  b->size_class = static_cast<std::uint32_t>(c);
  b->free_prev = nullptr;
  b->free_next = bn.head[c];
  if (bn.head[c] != nullptr) bn.head[c]->free_prev = b;
  bn.head[c] = b;
  bn.map[c / 64] |= std::uint64_t{1} << (c % 64);
  ++bn.blocks;
  ++free_blocks_;
  free_bytes_ += b->size;
}

void block_pool::erase_free(block* b) {
  bins* bn = find_bins(b->stream);
  assert(bn != nullptr && b->state == block_state::free);
  const std::size_t c = b->size_class;
  if (b->free_prev != nullptr) {
    b->free_prev->free_next = b->free_next;
  } else {
    bn->head[c] = b->free_next;
    if (b->free_next == nullptr) bn->map[c / 64] &= ~(std::uint64_t{1} << (c % 64));
  }
  if (b->free_next != nullptr) b->free_next->free_prev = b->free_prev;
  b->free_prev = b->free_next = nullptr;
  --bn->blocks;
  --free_blocks_;
  free_bytes_ -= b->size;
}

block* block_pool::fit_in(const bins& bn, std::size_t size) noexcept {
  std::size_t c = class_of(size);
  block* best = nullptr;
  for (block* b = bn.head[c]; b != nullptr; b = b->free_next)  // exact best fit within the class
    if (b->size >= size && (best == nullptr || b->size < best->size || (b->size == best->size && b->address < best->address))) best = b;
  if (best != nullptr) return best;
  // The next non-empty class: every block there fits.
  ++c;
  for (std::size_t w = c / 64; w < words; ++w) {
    std::uint64_t bits = bn.map[w];
    if (w == c / 64) bits &= c % 64 == 0 ? ~std::uint64_t{0} : ~((std::uint64_t{1} << (c % 64)) - 1);
    if (bits == 0) continue;
    int seen = 0;
    for (block* b = bn.head[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))]; b != nullptr && seen < 8;
         b = b->free_next, ++seen)
      if (best == nullptr || b->size < best->size) best = b;
    return best;
  }
  return nullptr;
}

block* block_pool::best_fit(void* stream, std::size_t size) const {
  const bins* own = stream != nullptr ? find_bins(stream) : nullptr;
  block* mine = own != nullptr && own->blocks != 0 ? fit_in(*own, size) : nullptr;
  block* any = any_bins_->blocks != 0 ? fit_in(*any_bins_, size) : nullptr;
  if (mine == nullptr) return any;
  if (any == nullptr) return mine;
  return any->size < mine->size ? any : mine;
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
  b->prev = b->next = nullptr;
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
  for (const auto& bn : bins_) {
    if (bn->stream == nullptr || bn->stream == stream || bn->blocks == 0) continue;
    if (fit_in(*bn, size) != nullptr) return true;
  }
  return false;
}

std::vector<void*> block_pool::owning_streams() const {
  std::vector<void*> out;
  for (const auto& bn : bins_)
    if (bn->stream != nullptr && bn->blocks != 0) out.push_back(bn->stream);
  return out;
}

void block_pool::make_pending(void* stream, std::vector<block*>& out) {
  bins* bn = find_bins(stream);
  if (bn == nullptr) return;
  for (std::size_t c = 0; c < classes && bn->blocks != 0; ++c) {
    while (block* b = bn->head[c]) {
      erase_free(b);
      b->state = block_state::pending;
      ++b->seg->busy_blocks;
      out.push_back(b);
    }
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
  for (const auto& bn : bins_) {
    for (std::size_t w = words; w-- > 0;) {
      if (bn->map[w] == 0) continue;
      const std::size_t c = w * 64 + 63 - static_cast<std::size_t>(std::countl_zero(bn->map[w]));
      for (const block* b = bn->head[c]; b != nullptr; b = b->free_next) best = std::max(best, b->size);
      break;
    }
  }
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
        const bins* bn = find_bins(b->stream);
        bool listed = false;
        for (const block* x = bn != nullptr ? bn->head[class_of(b->size)] : nullptr; x != nullptr; x = x->free_next)
          listed = listed || x == b;
        if (!listed) fail("a free block is missing from its size-class list");
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
  if (free_seen != free_blocks_) fail("the free lists hold blocks that are not free");
  std::size_t listed = 0;
  for (const auto& bn : bins_) listed += bn->blocks;
  if (listed != free_blocks_) fail("per-stream free counts disagree");
  if (free_bytes != free_bytes_) fail("free byte count is wrong");
}

}  // namespace spillway::detail
