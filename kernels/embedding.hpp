// Embedding lookup: forward gathers rows of a table by token id; backward scatter-adds the
// output gradient into the table's gradient, deterministically (no atomics; tokens in order).
#pragma once

#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace spillway::kernels {

/// out[t, :] = table[ids[t], :] for t < tokens; table [vocab, dim], out [tokens, dim].
/// With accumulate, out[t, :] += table[ids[t], :] instead (token + position embeddings: run the
/// token lookup, then the position lookup with accumulate).
///
/// An id outside [0, vocab), in forward or backward, is a usage_error at the stream's next
/// synchronize, the same on both backends: it names the first such token and its id, and the
/// stream stays failed. What the call wrote by then is unspecified (the cuda kernels have run,
/// reading such an id's row as zeros and leaving its gradient out; the cpu ones have not).
void embedding_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* table,
                       float* out, int tokens, int vocab, int dim, bool accumulate = false);

/// dtable[v, :] (+)= sum over t with ids[t] == v of dout[t, :], in token order, summed in
/// float32 and stored once per element. Without accumulate the whole dtable [vocab, dim] is
/// overwritten (rows no token uses get 0); with it, rows no token uses are left as they are.
void embedding_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* dout,
                        float* dtable, int tokens, int vocab, int dim, bool accumulate);

/// bf16 table, out, dout and dtable: the same arithmetic in float32 (a lookup copies the bits;
/// an accumulating lookup and each gradient sum are narrowed once), so every output is to_bf16
/// of the float32 kernel's on the widened inputs.
void embedding_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const bf16* table, bf16* out,
                       int tokens, int vocab, int dim, bool accumulate = false);
void embedding_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const bf16* dout, bf16* dtable,
                        int tokens, int vocab, int dim, bool accumulate);

}  // namespace spillway::kernels
