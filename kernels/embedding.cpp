// Dispatch and cpu launchers of the embedding, one body each for float32 and bf16 storage.
// Backward groups the tokens by id (a counting sort that keeps token order) and is parallel
// over table rows, so each gradient element sums its tokens in token order, in float32. Both
// backends refuse an id outside the vocabulary with one error, at the stream's synchronize.
#include "kernels/embedding.hpp"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"

namespace spillway::kernels {
namespace {

/// The id check both backends make on the stream (a usage_error at the next synchronize): the
/// cpu launchers for each token in order, the cuda ones for the first token their report names
/// (Note [Reports from kernels]).
void check_id(std::int32_t id, int token, int vocab) {
  SPILLWAY_EXPECTS_T(usage_error, id >= 0 && id < vocab,
                     "embedding: id " + std::to_string(id) + " of token " + std::to_string(token) +
                         " is outside the vocabulary of " + std::to_string(vocab));
}

void check_ids(const std::int32_t* ids, int tokens, int vocab) {
  for (int t = 0; t < tokens; ++t) check_id(ids[t], t, vocab);
}

#if SPILLWAY_HAVE_CUDA
/// The cuda dispatch: launch(report) queues the kernels, the last of which writes the first
/// token whose id is outside the vocabulary into the report slot; the host function after them
/// throws check_id's error for it.
template <class Launch>
void cuda_checked(kernel_context& ctx, stream s, int vocab, Launch launch) {
  detail::launch_with_report(ctx, s, std::move(launch), [vocab](std::int32_t token, std::int32_t id) {
    if (token >= 0) check_id(id, token, vocab);
  });
}

template <class T>
void cuda_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const T* table, T* out, int tokens,
                  int vocab, int dim, bool accumulate) {
  cuda_checked(ctx, s, vocab, [&](std::int32_t* report) {
    detail::cuda_embedding_forward(ctx, s, ids, table, out, tokens, vocab, dim, accumulate, report);
  });
}

template <class T>
void cuda_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const T* dout, T* dtable, int tokens,
                   int vocab, int dim, bool accumulate) {
  cuda_checked(ctx, s, vocab, [&](std::int32_t* report) {
    detail::cuda_embedding_backward(ctx, s, ids, dout, dtable, tokens, vocab, dim, accumulate, report);
  });
}
#endif

template <class T>
void forward(kernel_context& ctx, stream s, const std::int32_t* ids, const T* table, T* out, int tokens, int vocab,
             int dim, bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(tokens >= 0 && vocab > 0 && dim > 0, "embedding_forward");
  if (tokens == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s, cuda_forward(ctx, s, ids, table, out, tokens, vocab, dim, accumulate), [=] {
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
  SPILLWAY_KERNEL_LAUNCH(ctx, s, cuda_backward(ctx, s, ids, dout, dtable, tokens, vocab, dim, accumulate), [=] {
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
