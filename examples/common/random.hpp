// Deterministic random numbers for weights and data: the same seed gives the same bits on every
// platform and run (no std:: distributions, whose output the standard leaves to the library).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <oneapi/tbb/parallel_for.h>

namespace spillway::examples {

/// splitmix64: small, fast, and good enough for initial weights and synthetic data.
class rng {
 public:
  explicit rng(std::uint64_t seed) noexcept : state_(seed) {}
  /// A generator for one purpose (a tensor, a step's batch) derived from a seed and labels, so
  /// that each stream of numbers is independent of the order others are drawn in.
  rng(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0) noexcept
      : state_(mix(mix(seed ^ 0x5370696c6c776179ULL) ^ mix(a + 0x9e3779b97f4a7c15ULL) ^ (b * 0xbf58476d1ce4e5b9ULL))) {}

  std::uint64_t next() noexcept {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix(state_);
  }
  /// Skips `n` draws: the same state as `n` calls of next() (each adds one constant), so a
  /// stream can be cut into pieces that are drawn at once and give the same bits.
  void discard(std::uint64_t n) noexcept { state_ += n * 0x9e3779b97f4a7c15ULL; }
  /// Uniform in [0, 1).
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) noexcept { return n == 0 ? 0 : next() % n; }
  /// Standard normal (Box-Muller; one of the pair is dropped for simplicity): two draws.
  double normal() noexcept {
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static std::uint64_t mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
};

/// n floats drawn from N(0, stddev^2): the values `n` calls of r.normal() would give, drawn in
/// blocks at once (each block's part of the stream reached with discard), r left after them.
inline std::vector<float> normal_values(rng& r, std::size_t n, double stddev) {
  constexpr std::size_t block = 4096;
  std::vector<float> v(n);
  const rng start = r;
  tbb::parallel_for(std::size_t{0}, (n + block - 1) / block, [&](std::size_t k) {
    rng part = start;
    part.discard(2 * k * block);  // two draws a value
    for (std::size_t i = k * block; i < std::min(n, (k + 1) * block); ++i) v[i] = static_cast<float>(part.normal() * stddev);
  });
  r.discard(2 * n);
  return v;
}

}  // namespace spillway::examples
