// Dispatch and cpu launchers of the embedding. Backward is parallel over column blocks of the
// table and serial over tokens, so each gradient element sums its tokens in token order.
#include "kernels/embedding.hpp"

#include <cstring>
#include <string>

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

}  // namespace

void embedding_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* table,
                       float* out, int tokens, int vocab, int dim, bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(tokens >= 0 && vocab > 0 && dim > 0, "embedding_forward");
  if (tokens == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s,
                         detail::cuda_embedding_forward(ctx, s, ids, table, out, tokens, vocab, dim, accumulate), [=] {
    check_ids(ids, tokens, vocab);
    const auto d = static_cast<std::size_t>(dim);
    detail::parallel_for(static_cast<std::size_t>(tokens), detail::grain_for(d), [&](std::size_t b, std::size_t e) {
      for (std::size_t t = b; t < e; ++t) {
        const float* row = table + static_cast<std::size_t>(ids[t]) * d;
        float* o = out + t * d;
        if (accumulate)
          for (std::size_t j = 0; j < d; ++j) o[j] += row[j];
        else
          std::memcpy(o, row, d * sizeof(float));
      }
    });
  });
}

void embedding_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* dout,
                        float* dtable, int tokens, int vocab, int dim, bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(tokens >= 0 && vocab > 0 && dim > 0, "embedding_backward");
  SPILLWAY_KERNEL_LAUNCH(ctx, s,
                         detail::cuda_embedding_backward(ctx, s, ids, dout, dtable, tokens, vocab, dim, accumulate), [=] {
    check_ids(ids, tokens, vocab);
    const auto d = static_cast<std::size_t>(dim);
    const auto v = static_cast<std::size_t>(vocab);
    if (!accumulate) {
      detail::parallel_for(v, detail::grain_for(d), [&](std::size_t b, std::size_t e) {
        std::memset(dtable + b * d, 0, (e - b) * d * sizeof(float));
      });
    }
    // Column blocks of 16 floats: each block owns its columns of every table row.
    constexpr std::size_t block = 16;
    const std::size_t blocks = (d + block - 1) / block;
    detail::parallel_for(blocks, 1, [&](std::size_t b, std::size_t e) {
      const std::size_t j0 = b * block;
      const std::size_t j1 = e * block < d ? e * block : d;
      for (std::size_t t = 0; t < static_cast<std::size_t>(tokens); ++t) {
        float* row = dtable + static_cast<std::size_t>(ids[t]) * d;
        const float* g = dout + t * d;
        for (std::size_t j = j0; j < j1; ++j) row[j] += g[j];
      }
    });
  });
}

}  // namespace spillway::kernels
