// comm/: the one summing loop of every reduction over ranks (Note [Fixed-order reductions] in
// comm/communicator.hpp). Compiled with -ffp-contract=off and never with -ffast-math.
#pragma once

#include <cstddef>

namespace spillway::comm::detail {

/// out[i] = ((src[0][i] + src[1][i]) + src[2][i]) + ... + src[ranks-1][i] in fp32, for i < n.
/// `out` may be one of the sources at the same place (all sums of a block are read before any
/// of its elements is written), but must not overlap a source elsewhere.
void fixed_order_sum(const float* const* src, int ranks, float* out, std::size_t n) noexcept;

}  // namespace spillway::comm::detail
