// comm/: the argument checks every engine runs before a collective (usage_error naming the call),
// so solo() and world() refuse the same mistakes in the same words.
#pragma once

#include <cstddef>

namespace spillway::comm::detail {

void check_all_reduce(const float* data, std::size_t n);
void check_reduce_scatter(const float* in, const float* out, std::size_t n, int ranks, int rank);
void check_all_gather(const void* shard, const void* out, std::size_t n, std::size_t elem_bytes,
                      int ranks, int rank);
void check_broadcast(const void* data, std::size_t bytes, int root, int ranks);

}  // namespace spillway::comm::detail
