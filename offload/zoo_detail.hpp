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
trace make_transformer(const transformer_shape& s, std::uint32_t batch, std::uint32_t seq, std::uint32_t layers);

enum class cnn_kind { vgg16, resnet50, resnet152 };
trace make_cnn(cnn_kind kind, std::uint32_t batch, std::uint32_t image);

}  // namespace spillway::offload::detail
