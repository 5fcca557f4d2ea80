// Pattern generators for the CNN example's images: one intensity function per class, scaled and
// shifted per channel, with uniform noise; everything drawn from a per-step generator (images at
// once, each from its own part of the stream).
#include "examples/cnn/images.hpp"

#include <cmath>

#include <oneapi/tbb/parallel_for.h>

#include "examples/common/random.hpp"

namespace spillway::examples {

namespace {

// Intensity in [-1, 1] of pattern `kind` at pixel (y, x) of a size x size image, normalised coords.
double pattern(int kind, double y, double x, double freq, double phase, double cy, double cx) {
  constexpr double two_pi = 6.283185307179586;
  switch (kind) {
    case 0: return std::sin(two_pi * freq * y + phase);                      // horizontal stripes
    case 1: return std::sin(two_pi * freq * x + phase);                      // vertical stripes
    case 2: return std::sin(two_pi * freq * (x + y) * 0.7071 + phase);       // diagonal stripes
    case 3: return std::sin(two_pi * freq * std::hypot(y - cy, x - cx) + phase);  // rings
    case 4: return std::sin(two_pi * freq * x + phase) * std::sin(two_pi * freq * y + phase) > 0 ? 1.0 : -1.0;  // checks
    case 5: return std::hypot(y - cy, x - cx) < 0.15 + 0.1 * freq / 4.0 ? 1.0 : -1.0;  // disc
    case 6: return 2.0 * ((x * std::cos(phase) + y * std::sin(phase)) * 0.5 + 0.5) - 1.0;  // ramp
    default: {  // dots on a grid
      const double gy = std::fmod(y * freq * 2 + phase, 1.0), gx = std::fmod(x * freq * 2 + phase, 1.0);
      return std::hypot(gy - 0.5, gx - 0.5) < 0.2 ? 1.0 : -1.0;
    }
  }
}

}  // namespace

void make_images(std::uint64_t seed, std::int64_t step, int batch, int channels, int size, int classes,
                 std::vector<float>& pixels, std::vector<std::int32_t>& labels) {
  const rng step_rng(seed, 20, static_cast<std::uint64_t>(step));
  const std::size_t plane = static_cast<std::size_t>(size) * static_cast<std::size_t>(size);
  pixels.assign(static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels) * plane, 0.0f);
  labels.assign(static_cast<std::size_t>(batch), 0);
  // Images at once, each from its part of the step's stream (five draws, then per channel two
  // and one a pixel), reached by skipping the draws before it: the bits of one generator.
  const std::uint64_t draws = 5 + static_cast<std::uint64_t>(channels) * (2 + plane);
  tbb::parallel_for(0, batch, [&](int n) {
    rng r = step_rng;
    r.discard(static_cast<std::uint64_t>(n) * draws);
    const int kind = static_cast<int>(r.below(static_cast<std::uint64_t>(classes)));
    labels[static_cast<std::size_t>(n)] = kind;
    const double freq = 1.5 + 3.0 * r.uniform();
    const double phase = 6.283185307179586 * r.uniform();
    const double cy = 0.3 + 0.4 * r.uniform(), cx = 0.3 + 0.4 * r.uniform();
    for (int c = 0; c < channels; ++c) {
      const double gain = 0.4 + 0.6 * r.uniform();
      const double offset = 0.3 * (r.uniform() - 0.5);
      float* out = pixels.data() + (static_cast<std::size_t>(n) * static_cast<std::size_t>(channels) + static_cast<std::size_t>(c)) * plane;
      for (int y = 0; y < size; ++y)
        for (int x = 0; x < size; ++x) {
          const double v = gain * pattern(kind, (y + 0.5) / size, (x + 0.5) / size, freq, phase, cy, cx) + offset +
                           0.2 * (r.uniform() - 0.5);
          out[static_cast<std::size_t>(y) * static_cast<std::size_t>(size) + static_cast<std::size_t>(x)] = static_cast<float>(v);
        }
    }
  });
}

}  // namespace spillway::examples
