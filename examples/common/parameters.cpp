// Parameter registration (value, gradient, Adam moments) and the per-parameter Adam ops, which
// read the gradient and update the value and both moments in place.
#include "examples/common/parameters.hpp"

namespace spillway::examples {

parameter parameter_set::add(Session& s, const std::string& name, const std::vector<float>& initial) {
  parameter p;
  p.name = name;
  p.count = initial.size();
  const std::uint64_t bytes = p.count * sizeof(float);
  p.value = s.add_persistent(name, bytes, tensor_kind::parameter, initial.data());
  p.grad = s.add_persistent(name + ".grad", bytes, tensor_kind::gradient);
  p.m = s.add_persistent(name + ".adam_m", bytes, tensor_kind::optimizer_state);
  p.v = s.add_persistent(name + ".adam_v", bytes, tensor_kind::optimizer_state);
  params_.push_back(p);
  total_ += p.count;
  return p;
}

void parameter_set::adam_step(Session& s, kernels::kernel_context& ctx, const kernels::adam_config& config,
                              std::int64_t step) const {
  for (const auto& p : params_) {
    auto op = s.op(p.name + ".adam", {p.value, p.grad, p.m, p.v}, {p.value, p.m, p.v},
                   12.0 * static_cast<double>(p.count));
    kernels::adam_step(ctx, op.stream(), op.ptr<float>(p.value), op.ptr<float>(p.grad), op.ptr<float>(p.m),
                       op.ptr<float>(p.v), p.count, config, step);
  }
}

}  // namespace spillway::examples
