// Parameter registration (value, gradient, Adam moments in chunks) and the Adam ops, one per
// moment chunk, which read the gradient and update the value and both moments in place.
#include "examples/common/parameters.hpp"

#include <algorithm>

namespace spillway::examples {

parameter parameter_set::add(Session& s, const std::string& name, const std::vector<float>& initial) {
  parameter p;
  p.name = name;
  p.count = initial.size();
  const std::uint64_t bytes = p.count * sizeof(float);
  p.value = s.add_persistent(name, bytes, tensor_kind::parameter, initial.data());
  p.grad = s.add_persistent(name + ".grad", bytes, tensor_kind::gradient);
  const std::size_t chunks = (p.count + moment_chunk - 1) / moment_chunk;
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::string suffix = chunks == 1 ? "" : "." + std::to_string(c);
    const std::uint64_t n = std::min(moment_chunk, p.count - c * moment_chunk) * sizeof(float);
    p.m.push_back(s.add_persistent(name + ".adam_m" + suffix, n, tensor_kind::optimizer_state));
    p.v.push_back(s.add_persistent(name + ".adam_v" + suffix, n, tensor_kind::optimizer_state));
  }
  params_.push_back(p);
  total_ += p.count;
  return p;
}

void parameter_set::adam_step(Session& s, kernels::kernel_context& ctx, const kernels::adam_config& config,
                              std::int64_t step) const {
  kernels::adam_config warmed = config;
  warmed.lr = warmup_lr(config.lr, step);
  for (const auto& p : params_) {
    for (std::size_t c = 0; c < p.m.size(); ++c) {
      const std::size_t first = c * moment_chunk;
      const std::size_t n = std::min(moment_chunk, p.count - first);
      auto op = s.op(p.m.size() == 1 ? p.name + ".adam" : p.name + ".adam." + std::to_string(c),
                     {p.value, p.grad, p.m[c], p.v[c]}, {p.value, p.m[c], p.v[c]}, 12.0 * static_cast<double>(n));
      kernels::adam_step(ctx, op.stream(), op.ptr<float>(p.value) + first, op.ptr<float>(p.grad) + first,
                         op.ptr<float>(p.m[c]), op.ptr<float>(p.v[c]), n, warmed, step);
    }
  }
}

}  // namespace spillway::examples
