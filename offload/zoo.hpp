// Model zoo: training-iteration traces (forward, backward, Adam step) generated from the real
// layer shapes of well-known models, with batch size and sequence length as parameters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "prefetch/trace.hpp"

namespace spillway::offload {

struct zoo_options {
  std::uint32_t batch = 0;   ///< 0: the model's default (see zoo_model_names docs)
  std::uint32_t seq = 0;     ///< sequence length (transformers) / image side (CNNs); 0: default
  std::uint32_t layers = 0;  ///< transformers: override the number of blocks (0: real depth)
};

/// gpt2-small, gpt2-medium, gpt2-large, gpt2-xl (batch 8, seq 1024, bf16 with fp32 master
/// weights and Adam state), gpt3-6.7b, gpt3-13b (batch 4, seq 2048, same precision),
/// bert-large (batch 32, seq 512, same precision), vgg16, resnet50, resnet152 (batch 64,
/// 224x224 images, fp32).
std::vector<std::string> zoo_model_names();

/// The trace of one training iteration. Unknown names are a config_error listing the zoo.
trace make_model_trace(std::string_view name, const zoo_options& opt = {});

}  // namespace spillway::offload
