// What the models share at the edge of the device: batch uploads staged through pinned memory,
// and kernel workspaces taken from the Session as tensors of kind workspace.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "kernels/context.hpp"
#include "offload/swap_policy.hpp"

namespace spillway::examples {

/// One piece of a batch upload: `bytes` from host memory at `src` to device memory at `dst`.
struct upload_part {
  void* dst;
  const void* src;
  std::size_t bytes;
};

/// Uploads a batch from ordinary (pageable) host memory without making the caller wait.
/// A copy from pageable memory is synchronous for the caller (Device contract, as CUDA does), so
/// the parts are first copied into pinned memory, then enqueued from there. The pinned buffer
/// is allocated at the first upload and kept for the run (allocate_pinned is slow and may
/// synchronise); it is refilled each step only after an event says the last step's copies out
/// of it are done. A larger batch reallocates it once.
class pinned_staging {
 public:
  pinned_staging() = default;
  ~pinned_staging();
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;

  void upload(Device& dev, stream s, std::initializer_list<upload_part> parts);

 private:
  void release() noexcept;

  Device* dev_ = nullptr;
  void* pinned_ = nullptr;
  std::size_t bytes_ = 0;
  std::unique_ptr<owned_event> done_;  // the last upload's copies out of pinned_
};

/// Workspace for one op's kernels (Note [Workspace] in kernels/context.hpp), as a transient
/// Session tensor of kind workspace: inside the budget and known to the planner. Name it in the
/// op's writes, bind it inside the op with bind(), release it after the op.
class op_workspace {
 public:
  /// Registers `name` with at least `bytes` (256 when a kernel needs none on this backend, as a
  /// tensor cannot be empty).
  op_workspace(Session& s, std::string name, std::size_t bytes);
  [[nodiscard]] tensor_handle handle() const noexcept { return t_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  /// Binds the tensor's memory for the kernels launched while the returned scope lives.
  [[nodiscard]] kernels::workspace_scope bind(const Session::op_scope& op, kernels::kernel_context& ctx) const {
    return {ctx, op.ptr(t_), bytes_};
  }
  void release(Session& s) const { s.release(t_); }

 private:
  tensor_handle t_;
  std::size_t bytes_;
};

/// The workspace of an op whose kernels need one only in some settings (bf16 GEMMs widen their
/// operands into one on the cpu backend; fp32 GEMMs need none): an op_workspace when `bytes` > 0,
/// nothing otherwise, so that an op needing none keeps its tensor lists as they are.
class optional_workspace {
 public:
  optional_workspace(Session& s, std::string name, std::size_t bytes) {
    if (bytes > 0) ws_.emplace(s, std::move(name), bytes);
  }
  /// `tensors` followed by the workspace, if there is one: the op's writes.
  [[nodiscard]] std::vector<tensor_handle> with(std::initializer_list<tensor_handle> tensors) const {
    std::vector<tensor_handle> out(tensors);
    if (ws_) out.push_back(ws_->handle());
    return out;
  }
  /// Binds the workspace, if there is one, while the returned object lives.
  class binding {
   public:
    binding(const optional_workspace& w, const Session::op_scope& op, kernels::kernel_context& ctx) {
      if (w.ws_) scope_.emplace(ctx, op.ptr(w.ws_->handle()), w.ws_->bytes());
    }

   private:
    std::optional<kernels::workspace_scope> scope_;
  };
  [[nodiscard]] binding bind(const Session::op_scope& op, kernels::kernel_context& ctx) const { return {*this, op, ctx}; }
  void release(Session& s) const {
    if (ws_) ws_->release(s);
  }

 private:
  std::optional<op_workspace> ws_;
};

/// A tensor list built at run time (Session::op takes spans for those).
[[nodiscard]] inline std::vector<tensor_handle> tensors(std::initializer_list<tensor_handle> list) { return list; }

}  // namespace spillway::examples
