// Model zoo: training-iteration traces (forward, backward, Adam step) generated from the real
// layer shapes of well-known models, with batch size and sequence length as parameters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "prefetch/trace.hpp"

namespace spillway::offload {

/// How a model trains: fp32 throughout, or mixed precision with 16-bit (bf16 or fp16: both 2
/// bytes) parameters, gradients and activations and fp32 master weights and Adam moments as
/// optimizer state (per parameter 2 + 2 bytes on the model side, 12 bytes of optimizer state).
enum class zoo_precision : std::uint8_t { model_default, fp32, bf16, fp16 };
/// "default", "fp32", "bf16", "fp16"; config_error naming `where` otherwise.
zoo_precision parse_zoo_precision(std::string_view s, std::string_view where);

struct zoo_options {
  std::uint32_t batch = 0;   ///< 0: the model's default (see zoo_model_names docs)
  std::uint32_t seq = 0;     ///< sequence length (transformers) / image side (CNNs); 0: default
  std::uint32_t layers = 0;  ///< transformers: override the number of blocks (0: real depth)
  std::uint32_t hidden = 0;  ///< transformers: override the hidden size (0: the model's)
  std::uint32_t heads = 0;   ///< transformers: override the attention heads (0: the model's); divides hidden
  /// model_default: mixed bf16 for transformers, fp32 for CNNs.
  zoo_precision precision = zoo_precision::model_default;
  /// Clip gradients by their global norm: one op reads every gradient after the backward pass
  /// and every Adam step reads the norm, so no update starts before the last gradient.
  bool clip_grad_norm = false;
};

/// gpt2-small, gpt2-medium, gpt2-large, gpt2-xl (batch 8, seq 1024, bf16 with fp32 master
/// weights and Adam state), gpt3-6.7b, gpt3-13b (batch 4, seq 2048, same precision),
/// bert-large (batch 32, seq 512, same precision), vgg16, resnet50, resnet152 (batch 64,
/// 224x224 images, fp32). Every Adam step (and the clipping op) is host_capable with its host
/// cost (Note [Host ops] in prefetch/plan.hpp).
std::vector<std::string> zoo_model_names();

/// What one step of a zoo model trains: parameters (elements) and tokens per step (batch x
/// sequence for transformers, images for CNNs), for model FLOPs (6 x parameters x tokens).
struct zoo_model_size {
  std::uint64_t parameters = 0;
  std::uint64_t tokens = 0;
};
/// `t` must be make_model_trace(name, opt). config_error for an unknown name.
zoo_model_size zoo_size(std::string_view name, const zoo_options& opt, const trace& t);

/// The trace of one training iteration. Unknown names are a config_error listing the zoo; so
/// are a shape override on a CNN, heads that do not divide the hidden size, and sizes past
/// what a trace can describe.
trace make_model_trace(std::string_view name, const zoo_options& opt = {});

}  // namespace spillway::offload
