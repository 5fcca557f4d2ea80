// Procedural images for the CNN example: each class is a kind of pattern (stripes at three
// angles, rings, checks, a disc, a ramp, dots) with random scale, phase, colour and noise.
#pragma once

#include <cstdint>
#include <vector>

namespace spillway::examples {

inline constexpr int image_pattern_count = 8;

/// `batch` NCHW images of `channels` x `size` x `size` floats (about [-1, 1]) into `pixels`, their
/// classes (in [0, classes), classes <= image_pattern_count) into `labels`. The same
/// (seed, step) gives the same batch.
void make_images(std::uint64_t seed, std::int64_t step, int batch, int channels, int size, int classes,
                 std::vector<float>& pixels, std::vector<std::int32_t>& labels);

}  // namespace spillway::examples
