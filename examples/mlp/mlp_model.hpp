// oversized_mlp's model: a deep, wide ReLU MLP learning to classify inputs the way a fixed
// random teacher network does, every tensor a Session tensor.
#pragma once

#include <memory>

#include "examples/common/options.hpp"
#include "examples/common/shares.hpp"
#include "examples/common/trainer.hpp"

namespace spillway::examples {

struct mlp_shape {
  int inputs = 512;
  int width = 2048;
  int depth = 8;        ///< hidden layers
  int classes = 16;
  int batch = 256;
  int teacher_hidden = 64;
  float lr = 3e-4f;     ///< Adam learning rate
  float clip_grad_norm = 0;  ///< > 0: global-norm gradient clipping before Adam (example_options)
};

[[nodiscard]] mlp_shape mlp_preset(preset p);
[[nodiscard]] std::unique_ptr<model> make_mlp(const mlp_shape& shape, std::uint64_t seed,
                                              precision p = precision::fp32,
                                              const batch_shares& shares = {});
[[nodiscard]] std::unique_ptr<model> make_mlp(const example_options& o);
run_result run_mlp(const example_options& o, const step_observer& on_step = {});

}  // namespace spillway::examples
