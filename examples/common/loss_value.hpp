// The step's mean loss as a Session tensor: one float, registered persistent so that one tensor
// serves every step. (A new loop may as well add a transient of kind metric each step: the
// planner keeps metrics on the device for the host read, and reads are uses it plans for.)
// It is read into pinned memory: a copy to pageable memory would be synchronous for the caller
// (Device contract), and one every step is the kind of stall the examples keep out.
#pragma once

#include "offload/swap_policy.hpp"

namespace spillway::examples {

class loss_value {
 public:
  loss_value() = default;
  ~loss_value() {
    if (pinned_ != nullptr) dev_->deallocate_pinned(pinned_, sizeof(float));
  }
  loss_value(const loss_value&) = delete;
  loss_value& operator=(const loss_value&) = delete;

  /// Registers the tensor "loss" (call from model::build).
  void add(Session& s) {
    t_ = s.add_persistent("loss", sizeof(float), tensor_kind::parameter);
    dev_ = &s.device();
    pinned_ = static_cast<float*>(dev_->allocate_pinned(sizeof(float)));
  }
  [[nodiscard]] tensor_handle handle() const noexcept { return t_; }
  /// The value the last op that wrote it left (waits for that op).
  [[nodiscard]] float read(Session& s) const {
    s.read(t_, pinned_, sizeof(float));
    return *pinned_;
  }

 private:
  tensor_handle t_;
  Device* dev_ = nullptr;
  float* pinned_ = nullptr;
};

}  // namespace spillway::examples
