// Dispatch and cpu launchers of the embedding, one body each for float32 and bf16 storage.
// Backward groups the tokens by id (a counting sort that keeps token order) and is parallel
// over table rows, so each gradient element sums its tokens in token order, in float32.
#include "kernels/embedding.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"

namespace spillway::kernels {
namespace {

void check_ids(const std::int32_t* ids, int tokens, int vocab) {
  for (int t = 0; t < tokens; ++t)
    SPILLWAY_EXPECTS_T(usage_error, ids[t] >= 0 && ids[t] < vocab,
                     "embedding: id " + std::to_string(ids[t]) + " of token " + std::to_string(t) +
                         " is outside the vocabulary of " + std::to_string(vocab));
}

template <class T>
void forward(kernel_context& ctx, stream s, const std::int32_t* ids, const T* table, T* out, int tokens, int vocab,
             int dim, bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(tokens >= 0 && vocab > 0 && dim > 0, "embedding_forward");
  if (tokens == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s,
                         detail::cuda_embedding_forward(ctx, s, ids, table, out, tokens, vocab, dim, accumulate), [=] {
    check_ids(ids, tokens, vocab);
    const auto d = static_cast<std::size_t>(dim);
    detail::parallel_for(static_cast<std::size_t>(tokens), detail::grain_for(d), [&](std::size_t b, std::size_t e) {
      for (std::size_t t = b; t < e; ++t) {
        const T* row = table + static_cast<std::size_t>(ids[t]) * d;
        T* o = out + t * d;
        if (accumulate)
          for (std::size_t j = 0; j < d; ++j) o[j] = store_as<T>(load(o[j]) + load(row[j]));
        else
          std::memcpy(o, row, d * sizeof(T));
      }
    });
  });
}

template <class T>
void backward(kernel_context& ctx, stream s, const std::int32_t* ids, const T* dout, T* dtable, int tokens, int vocab,
              int dim, bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(tokens >= 0 && vocab > 0 && dim > 0, "embedding_backward");
  SPILLWAY_KERNEL_LAUNCH(ctx, s,
                         detail::cuda_embedding_backward(ctx, s, ids, dout, dtable, tokens, vocab, dim, accumulate), [=] {
    check_ids(ids, tokens, vocab);
    const auto d = static_cast<std::size_t>(dim);
    const auto v = static_cast<std::size_t>(vocab);
    const auto nt = static_cast<std::size_t>(tokens);
    // The tokens of id i, in token order, are order[start[i]] .. order[start[i + 1] - 1].
    std::vector<std::size_t> start(v + 1, 0);
    std::vector<std::size_t> order(nt);
    for (std::size_t t = 0; t < nt; ++t) ++start[static_cast<std::size_t>(ids[t]) + 1];
    for (std::size_t i = 0; i < v; ++i) start[i + 1] += start[i];
    std::vector<std::size_t> next(start.begin(), start.end() - 1);
    for (std::size_t t = 0; t < nt; ++t) order[next[static_cast<std::size_t>(ids[t])]++] = t;
    detail::parallel_for(v, detail::grain_for(d * (1 + nt / v)), [&](std::size_t b, std::size_t e) {
      std::vector<float> acc(d);
      for (std::size_t i = b; i < e; ++i) {
        T* row = dtable + i * d;
        if (start[i] == start[i + 1]) {
          if (!accumulate) std::memset(row, 0, d * sizeof(T));
          continue;
        }
        for (std::size_t j = 0; j < d; ++j) acc[j] = accumulate ? load(row[j]) : 0.0f;
        for (std::size_t k = start[i]; k < start[i + 1]; ++k) {
          const T* g = dout + order[k] * d;
          for (std::size_t j = 0; j < d; ++j) acc[j] += load(g[j]);
        }
        for (std::size_t j = 0; j < d; ++j) row[j] = store_as<T>(acc[j]);
      }
    });
  });
}

}  // namespace

void embedding_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* table,
                       float* out, int tokens, int vocab, int dim, bool accumulate) {
  forward(ctx, s, ids, table, out, tokens, vocab, dim, accumulate);
}

void embedding_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const bf16* table, bf16* out,
                       int tokens, int vocab, int dim, bool accumulate) {
  forward(ctx, s, ids, table, out, tokens, vocab, dim, accumulate);
}

void embedding_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* dout,
                        float* dtable, int tokens, int vocab, int dim, bool accumulate) {
  backward(ctx, s, ids, dout, dtable, tokens, vocab, dim, accumulate);
}

void embedding_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const bf16* dout, bf16* dtable,
                        int tokens, int vocab, int dim, bool accumulate) {
  backward(ctx, s, ids, dout, dtable, tokens, vocab, dim, accumulate);
}

}  // namespace spillway::kernels
