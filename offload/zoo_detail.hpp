// Zoo internals: the shape records and the generators behind make_model_trace.
// One generator per family (zoo_transformer.cpp, zoo_cnn.cpp).
#pragma once

#include <cstdint>

#include "prefetch/trace.hpp"

namespace spillway::offload::detail {

struct transformer_shape {
  std::uint32_t layers, hidden, heads, vocab;
  bool mlm_head;  ///< BERT's masked-LM transform before the tied decoder
};
/// How the builder stores values: bytes per parameter/gradient/activation element, and whether
/// fp32 master weights sit beside 16-bit parameters (mixed precision); clip: see zoo_options.
struct precision_setup {
  std::uint32_t act_bytes;
  bool mixed;
  bool clip;
};
trace make_transformer(const transformer_shape& s, std::uint32_t batch, std::uint32_t seq, std::uint32_t layers,
                       const precision_setup& p);

enum class cnn_kind { vgg16, resnet50, resnet152 };
trace make_cnn(cnn_kind kind, std::uint32_t batch, std::uint32_t image, const precision_setup& p);

}  // namespace spillway::offload::detail
