// A model's trainable parameters as Session tensors: each parameter brings its gradient and its
// Adam moments (m, v), all persistent; one Adam op per parameter updates them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/adam.hpp"
#include "kernels/context.hpp"
#include "offload/swap_policy.hpp"

namespace spillway::examples {

struct parameter {
  std::string name;
  std::size_t count = 0;  ///< float elements
  tensor_handle value;
  tensor_handle grad;
  tensor_handle m;
  tensor_handle v;
};

class parameter_set {
 public:
  /// Registers `name` (with `initial.size()` floats), its gradient "<name>.grad" and its Adam
  /// state "<name>.adam_m", "<name>.adam_v" (zeros) with the session.
  parameter add(Session& s, const std::string& name, const std::vector<float>& initial);

  /// One Adam step over every parameter, one op each ("<name>.adam"), in registration order.
  void adam_step(Session& s, kernels::kernel_context& ctx, const kernels::adam_config& config,
                 std::int64_t step) const;

  [[nodiscard]] std::uint64_t count() const noexcept { return total_; }
  [[nodiscard]] const std::vector<parameter>& all() const noexcept { return params_; }

 private:
  std::vector<parameter> params_;
  std::uint64_t total_ = 0;
};

}  // namespace spillway::examples
