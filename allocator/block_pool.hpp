// The free-list policy of the caching allocator: segments carved into blocks, best fit per
// stream, splitting and coalescing. Not thread-safe; the caching allocator holds the lock.
//
// Glossary. A *segment* is one allocation from the upstream resource. It is tiled by *blocks*,
// kept in address order as a doubly linked list. A block is live (handed out), free (in the
// free index, usable at once on its `stream`, or on any stream when `stream` is null), or
// pending (freed, waiting for an event before any stream may use it, Note [Stream reuse]).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace spillway::detail {

enum class block_state : std::uint8_t { live, free, pending };

struct segment;
class block_pool;

struct block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  ///< live blocks: bytes asked for
  void* stream = nullptr;     ///< live: allocation stream; free: stream it is free on (null: any)
  block_state state = block_state::free;
  segment* seg = nullptr;
  block* prev = nullptr;  ///< neighbours by address within the segment
  block* next = nullptr;
  block* free_prev = nullptr;  ///< free blocks: neighbours in their size-class list
  block* free_next = nullptr;
  std::uint32_t size_class = 0;  ///< free blocks: the class list holding it
};

struct segment {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  void* stream = nullptr;       ///< stream of the allocation that created it (for snapshots)
  std::size_t busy_blocks = 0;  ///< live or pending blocks
  block* first = nullptr;
  block_pool* pool = nullptr;   ///< the pool it belongs to
};

/// One pool (small or large): its segments and the index of its free blocks.
class block_pool {
 public:
  /// `min_split`: a free remainder smaller than this stays with the block it was cut from.
  explicit block_pool(std::size_t min_split);
  ~block_pool();
  block_pool(const block_pool&) = delete;
  block_pool& operator=(const block_pool&) = delete;

  /// The smallest free block of at least `size` bytes usable on `stream` (its own free blocks
  /// and those free on any stream; on a tie in size its own win). nullptr when none.
  [[nodiscard]] block* best_fit(void* stream, std::size_t size) const;
  /// Marks free block `b` live for `stream`, splitting off the remainder when large enough.
  block* take(block* b, std::size_t size, std::size_t requested, void* stream);
  /// Adds a segment of fresh upstream memory as one block free on any stream; returns it.
  block* add_segment(std::uintptr_t address, std::size_t size, void* stream);
  /// Live or pending block back to free on `stream` (null: any stream), merged with free
  /// neighbours that are free on the same stream or on any stream.
  void release(block* b, void* stream);
  /// True when some block free on a stream other than `stream` (and not on any) is at least
  /// `size` bytes: handing that stream's blocks over could serve the request.
  [[nodiscard]] bool others_hold(void* stream, std::size_t size) const;
  /// The streams other than null that hold free blocks.
  [[nodiscard]] std::vector<void*> owning_streams() const;
  /// Moves every block free on `stream` to pending and appends it to `out`.
  void make_pending(void* stream, std::vector<block*>& out);
  /// A pending block becomes free on any stream (and merges).
  void settle(block* b);
  /// Removes every segment that is one block free on any stream (or on `also`, when not null);
  /// returns them for the caller to give back upstream, each with the stream its block is free
  /// on (null: no device work uses it).
  struct released_segment {
    std::uintptr_t address;
    std::size_t size;
    void* free_on;
  };
  std::vector<released_segment> remove_free_segments(void* also = nullptr);

  [[nodiscard]] std::size_t largest_free() const;
  [[nodiscard]] std::size_t free_bytes() const noexcept { return free_bytes_; }
  [[nodiscard]] const std::vector<segment*>& segments() const noexcept { return segments_; }
  /// Throws spillway::error naming the first broken invariant.
  void check_invariants() const;

 private:
  // Free blocks sit in segregated lists, one set per stream (null: any stream): a size class per
  // eighth of a power of two, a bitmap of the non-empty classes. Finding the smallest fitting
  // block scans one class list and then jumps to the next non-empty class: no allocation, no
  // tree walk. See Note [Size classes] in block_pool.cpp.
  static constexpr int class_bits = 3;
  static constexpr std::size_t classes = 48 << class_bits;
  static constexpr std::size_t words = classes / 64;
  struct bins {
    void* stream = nullptr;
    std::size_t blocks = 0;
    std::uint64_t map[words] = {};
    block* head[classes] = {};
  };
  static std::size_t class_of(std::size_t size) noexcept {  // Note [Size classes]
    const int top = std::bit_width(size) - 1;                 // >= 9 for sizes >= 512
    if (top < 9 + class_bits) return size >> 9;              // small sizes: one class per 512 B
    const std::size_t sub = (size >> (top - class_bits)) & ((1u << class_bits) - 1);
    const std::size_t c = (static_cast<std::size_t>(top - 9) << class_bits) + sub + (1u << class_bits);
    return c < classes ? c : classes - 1;
  }
  [[nodiscard]] bins* find_bins(void* stream) const noexcept;
  bins& bins_for(void* stream);
  [[nodiscard]] static block* fit_in(const bins& b, std::size_t size) noexcept;
  block* new_block();
  void delete_block(block* b);
  void insert_free(block* b);
  void erase_free(block* b);
  block* merge(block* left, block* right);

  std::size_t min_split_;
  std::vector<std::unique_ptr<bins>> bins_;  // few: one per stream that freed here, plus "any"
  bins* any_bins_ = nullptr;                  // blocks free on any stream
  mutable bins* last_bins_ = nullptr;        // the last stream's, looked up (streams repeat)
  std::vector<segment*> segments_;
  std::vector<block*> spare_blocks_;
  std::vector<std::unique_ptr<block[]>> block_chunks_;
  std::size_t free_bytes_ = 0;
  std::size_t free_blocks_ = 0;
};

}  // namespace spillway::detail
