// Embedding lookup: forward gathers rows of a table by token id; backward scatter-adds the
// output gradient into the table's gradient, deterministically (no atomics; tokens in order).
#pragma once

#include <cstdint>

#include "kernels/context.hpp"

namespace spillway::kernels {

/// out[t, :] = table[ids[t], :] for t < tokens; table [vocab, dim], out [tokens, dim].
/// With accumulate, out[t, :] += table[ids[t], :] instead (token + position embeddings: run the
/// token lookup, then the position lookup with accumulate). Ids outside [0, vocab) are an error
/// on the cpu backend and give zeros on the cuda backend.
void embedding_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* table,
                       float* out, int tokens, int vocab, int dim, bool accumulate = false);

/// dtable[v, :] (+)= sum over t with ids[t] == v of dout[t, :], in token order.
/// Without accumulate the whole dtable [vocab, dim] is overwritten (rows no token uses get 0).
void embedding_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* dout,
                        float* dtable, int tokens, int vocab, int dim, bool accumulate);

}  // namespace spillway::kernels
