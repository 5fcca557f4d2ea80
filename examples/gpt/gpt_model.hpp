// oversized_gpt's model: a GPT-style decoder (token and position embeddings, blocks of causal
// self-attention and a GELU MLP with pre-layer-norm, a final layer norm and an output head tied
// to the token embedding) over byte tokens, every tensor a Session tensor.
#pragma once

#include <memory>
#include <string>

#include "examples/common/options.hpp"
#include "examples/common/shares.hpp"
#include "examples/common/trainer.hpp"

namespace spillway::examples {

struct gpt_shape {
  int vocab = 256;  ///< byte tokens
  int seq = 128;
  int channels = 256;
  int heads = 8;
  int layers = 8;
  int batch = 8;
  float clip_grad_norm = 0;  ///< > 0: global-norm gradient clipping before Adam (example_options)
};

/// The shape of each preset.
[[nodiscard]] gpt_shape gpt_preset(preset p);

/// A GPT for these options: preset shape, o.prec, o.seed, and the text of o.data (a generated corpus
/// when o.data is empty). Reading the file happens here, so a bad path fails before training.
[[nodiscard]] std::unique_ptr<model> make_gpt(const example_options& o);
[[nodiscard]] std::unique_ptr<model> make_gpt(const gpt_shape& shape, std::uint64_t seed,
                                              std::shared_ptr<const std::string> corpus,
                                              precision p = precision::fp32,
                                              const batch_shares& shares = {});

/// Trains make_gpt(o) with train().
run_result run_gpt(const example_options& o, const step_observer& on_step = {});

}  // namespace spillway::examples
