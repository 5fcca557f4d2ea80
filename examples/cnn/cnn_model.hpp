// oversized_cnn's model: a small ResNet-style network (a stem convolution, stages of residual
// blocks joined by max pooling and a 1x1 widening convolution, global average pooling, a linear
// head) classifying procedurally generated images, every tensor a Session tensor.
#pragma once

#include <memory>
#include <vector>

#include "examples/common/options.hpp"
#include "examples/common/shares.hpp"
#include "examples/common/trainer.hpp"

namespace spillway::examples {

struct cnn_shape {
  int batch = 32;
  int image = 32;                    ///< square images, 3 channels
  std::vector<int> stage_channels = {32, 64, 128, 256};  ///< the first is the stem's
  int blocks_per_stage = 3;
  int classes = 8;
  float lr = 3e-4f;  ///< Adam learning rate
  float clip_grad_norm = 0;  ///< > 0: global-norm gradient clipping before Adam (example_options)
};

[[nodiscard]] cnn_shape cnn_preset(preset p);
[[nodiscard]] std::unique_ptr<model> make_cnn(const cnn_shape& shape, std::uint64_t seed,
                                              precision p = precision::fp32,
                                              const batch_shares& shares = {});
[[nodiscard]] std::unique_ptr<model> make_cnn(const example_options& o);
run_result run_cnn(const example_options& o, const step_observer& on_step = {});

}  // namespace spillway::examples
