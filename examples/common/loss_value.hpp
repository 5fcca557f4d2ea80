// The step's mean loss as a Session tensor: one float, persistent, so that it can be read with
// Session::read after the last op that touches it (a plan may drop a transient after its last op).
#pragma once

#include "offload/swap_policy.hpp"

namespace spillway::examples {

class loss_value {
 public:
  /// Registers the tensor "loss" (call from model::build).
  void add(Session& s) { t_ = s.add_persistent("loss", sizeof(float), tensor_kind::parameter); }
  [[nodiscard]] tensor_handle handle() const noexcept { return t_; }
  /// The value the last op that wrote it left (waits for that op).
  [[nodiscard]] float read(Session& s) const {
    float v = 0;
    s.read(t_, &v, sizeof v);
    return v;
  }

 private:
  tensor_handle t_;
};

}  // namespace spillway::examples
