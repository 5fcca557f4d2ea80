// What the README's code blocks leave to the reader (a weight size, an init buffer, a GEMM of
// their own), as one struct the generated block functions read their free names from
// (Note [README blocks] in extract_readme.py). It includes the public header and nothing else
// of Spillway's, so a block compiles only if that header makes its names reachable.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "offload/swap_policy.hpp"

namespace readme {

/// The stand-ins, by the names the README uses. Sizes are tiny so the blocks run in a test.
struct stand_ins {
  std::uint64_t w_bytes = 0;  ///< bytes of the weight (and of its gradient)
  std::uint64_t x_bytes = 0;  ///< bytes of one input batch
  std::uint64_t y_bytes = 0;  ///< bytes of the layer's output
  const void* w_init = nullptr;  ///< the weight's initial values (w_bytes)
  const void* batch = nullptr;   ///< one input batch in host memory (x_bytes)
  int steps = 0;                 ///< iterations of the training loop
  /// The reader's own GEMM: y = x w^T, launched on the stream.
  std::function<void(const float* x, const float* w, float* y, spillway::stream s)> my_gemm;
};

/// What a block leaves behind: a Session's reports and the trace it recorded, when it made one.
struct outcome {
  bool made_session = false;
  std::vector<spillway::iteration_report> history;
  spillway::trace recorded;
};

/// One extracted block: where it stands in README.md, and the function that runs it.
struct block {
  const char* where;  ///< "README.md:LINE", the line of its opening fence
  outcome (*run)(const stand_ins&);
};

/// Every ```cpp block of README.md, in order (defined in the generated readme_blocks.cpp).
extern const std::vector<block> blocks;

}  // namespace readme
