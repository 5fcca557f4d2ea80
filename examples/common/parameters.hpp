// A model's trainable parameters as Session tensors: each parameter brings its gradient and its
// Adam moments (m, v), all persistent. The moments of a large parameter are kept in chunks, one
// Adam op per chunk (Note [Chunked moments]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/adam.hpp"
#include "examples/common/gradient_exchange.hpp"
#include "examples/common/precision.hpp"
#include "examples/common/shares.hpp"
#include "kernels/context.hpp"
#include "offload/swap_policy.hpp"

namespace spillway::examples {

// Note [Chunked moments]
// Adam reads a parameter, its gradient and both moments and writes three of them: four times the
// parameter's bytes on the device at once, and the largest working set of many models. Under a
// budget of a few such sets, the next parameter's state cannot come in while the current one is
// updated, and the optimizer step waits on the link. With the moments in chunks of at most
// moment_chunk elements, each Adam op holds the parameter and gradient plus one chunk of each
// moment: the chunks stream through while the parameter stays, and the next parameter's state
// fits beside it. The update of every element is the same arithmetic, so results do not change.
struct parameter {
  std::string name;
  std::size_t index = 0;  ///< its place in the set, in registration order
  std::size_t count = 0;  ///< float elements
  tensor_handle value;   ///< the weights the passes read: fp32, or bf16 (Note [Mixed precision])
  tensor_handle grad;    ///< in the same format as value
  tensor_handle master;  ///< bf16 only: the fp32 master weights Adam updates (none in fp32)
  std::vector<tensor_handle> m;  ///< Adam moments, chunk by chunk (of this rank's shard)
  std::vector<tensor_handle> v;
  /// This rank's shard of the elements, whose optimizer state (moments, master) it owns
  /// (ZeRO): all of them outside a data-parallel job.
  std::size_t shard_first = 0;
  std::size_t shard_count = 0;
  tensor_handle grad_sum;  ///< with micro-batches in one process: the fp32 sum of their gradients
};

/// Steps over which the learning rate rises linearly to its full value. Adam's first steps move
/// every weight by about the learning rate whatever its gradient, which at full rate throws a
/// freshly initialised model far off (the loss doubled at step 2 before); warming up keeps the
/// loss falling from the start.
inline constexpr std::int64_t warmup_steps = 20;

/// The learning rate at Adam step `step` (from 1): lr x step / warmup_steps, then lr.
[[nodiscard]] constexpr float warmup_lr(float lr, std::int64_t step) noexcept {
  return step >= warmup_steps ? lr : lr * static_cast<float>(step < 1 ? 1 : step) / static_cast<float>(warmup_steps);
}

// Note [Clipping order]
// The global norm must be the same bits under every policy and budget (Invariant 1), so it is
// summed in one fixed order: each gradient's sum of squares in the fixed order of the kernel
// (Note [Sum of squares order] in kernels/grad_norm.hpp), added into one float gradient by
// gradient in registration order, one op each. The planner may move that float and the
// gradients between ops; it never changes their bytes or the order of the ops. The clip ops
// read the float on the device, so nothing waits for the host in the middle of the step.

/// Elements per chunk of the Adam moments (4 MiB of floats).
inline constexpr std::size_t moment_chunk = std::size_t{1} << 20;

class parameter_set {
 public:
  explicit parameter_set(precision p = precision::fp32, batch_shares shares = {})
      : prec_(p), shares_(std::move(shares)) {}

  /// Registers `name` (with `initial.size()` elements), its gradient "<name>.grad" and its Adam
  /// state "<name>.adam_m", "<name>.adam_v" (fp32 zeros; with ".<chunk>" appended when chunked)
  /// with the session. In bf16, `name` and its gradient are bf16 (the weights rounded from
  /// `initial`) and "<name>.master" holds `initial` in fp32.
  parameter add(Session& s, const std::string& name, const std::vector<float>& initial);

  /// One Adam step over every parameter, one op per moment chunk ("<name>.adam", or
  /// "<name>.adam.<chunk>" when chunked), the last registered first (the order the backward pass
  /// gives the gradients in). In bf16 each op also reads and
  /// writes the master and writes the bf16 weights rounded from it. `step` counts from 1; the
  /// learning rate warms up linearly over the first warmup_steps steps (see warmup_lr).
  void adam_step(Session& s, kernels::kernel_context& ctx, const kernels::adam_config& config,
                 std::int64_t step) const;

  /// Global-norm gradient clipping (Note [Clipping order]): when max_norm > 0, scales every
  /// gradient by min(1, max_norm / (norm + 1e-6)), the norm taken over all the gradients
  /// together in float32. Call it after the backward pass and before adam_step. Ops, in
  /// registration order: "<name>.optim.norm" (reads the gradient, adds its sum of squares into
  /// the transient "grad_norm.sum_sq"; the first op sets it), then "<name>.optim.clip" (scales
  /// the gradient in place by the factor read from that sum on the device). max_norm 0 adds no
  /// op; a negative or non-finite one is a usage_error.
  void clip_grad_norm(Session& s, kernels::kernel_context& ctx, float max_norm) const;

  /// One training step over the shares of its batch (Note [Micro-batches] in
  /// parameters_shared.cpp): `pass(mb)` runs micro-batch mb's forward and backward pass (the
  /// whole batch when there are no shares), `read_loss()` reads its mean loss; then the
  /// gradients are summed and reduced, clipped (`clip_norm` > 0, whole batches only), and Adam
  /// updates this rank's shard, which is then shared. A whole batch without clipping updates
  /// each parameter as its gradient is handed over instead (Note [Updates in the backward pass]
  /// in parameters_shared.cpp). Returns the step's mean loss.
  float train_step(Session& s, kernels::kernel_context& ctx, std::int64_t step, const std::function<void(int)>& pass,
                   const std::function<float()>& read_loss, const kernels::adam_config& config, float clip_norm) const;

  /// Called by a pass right after the op that last writes `p`'s gradient in its backward pass
  /// (no later op of the pass may read `p`): in a data-parallel job the gradient is staged and
  /// its bucket queued for the reduction over the ranks while the pass goes on (Note
  /// [Overlapped gradient exchange]); in a step of one whole batch without clipping, `p`'s Adam
  /// update runs there (Note [Updates in the backward pass]); elsewhere nothing. A gradient not
  /// handed over is staged, or updated, after the pass.
  void gradient_ready(Session& s, kernels::kernel_context& ctx, const parameter& p) const;
  /// The gradient exchange's counts over the steps so far (zeros outside a data-parallel job).
  [[nodiscard]] gradient_exchange::stats exchange_stats() const noexcept {
    return exchange_ ? exchange_->counts() : gradient_exchange::stats{};
  }

  [[nodiscard]] const batch_shares& shares() const noexcept { return shares_; }
  [[nodiscard]] std::uint64_t count() const noexcept { return total_; }
  [[nodiscard]] precision format() const noexcept { return prec_; }
  [[nodiscard]] const std::vector<parameter>& all() const noexcept { return params_; }

 private:
  void adam_parameter(Session& s, kernels::kernel_context& ctx, const kernels::adam_config& warmed, std::int64_t step,
                      const parameter& p) const;
  void zero_gradients(Session& s) const;
  void add_micro_batch(Session& s, kernels::kernel_context& ctx, int local_index) const;
  void reduce_gradients(Session& s, kernels::kernel_context& ctx) const;
  float exchange_step(Session& s, kernels::kernel_context& ctx, std::int64_t step, const std::function<void(int)>& pass,
                      const std::function<float()>& read_loss, const kernels::adam_config& config) const;

  precision prec_;
  batch_shares shares_;
  std::vector<parameter> params_;
  std::uint64_t total_ = 0;
  // A data-parallel job's (made at its first step); shared by copies of the set.
  mutable std::shared_ptr<gradient_exchange> exchange_;
  // While a pass of a step that updates in the backward pass runs (Note [Updates in the backward
  // pass]): that step's settings, and which parameters gradient_ready has updated.
  struct backward_updates {
    bool on = false;
    kernels::adam_config warmed{};
    std::int64_t step = 0;
    std::vector<bool> done;
  };
  mutable backward_updates in_backward_;
  // Set once the updates are to run after the pass for good (a plan that runs some on the host).
  mutable bool updates_after_pass_ = false;
};

}  // namespace spillway::examples
