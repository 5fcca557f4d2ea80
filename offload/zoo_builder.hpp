// Zoo builder: records forward ops with what their backward needs, then emits the backward
// pass in reverse (with gradient accumulation where a tensor feeds several ops) and Adam.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "prefetch/trace.hpp"

namespace spillway::offload::detail {

class model_builder {
 public:
  /// act_bytes: bytes per activation/weight element; mixed: bf16 weights and gradients with
  /// fp32 master weights and Adam moments (all optimizer_state), else everything fp32;
  /// clip: a global-norm clipping op before the Adam steps (zoo_options::clip_grad_norm).
  model_builder(std::uint32_t act_bytes, bool mixed, bool clip = false);

  /// A tensor the data loader writes (no gradient): an op "load.<name>" writes it.
  tensor_id input(const std::string& name, std::uint64_t elems, std::uint32_t elem_bytes = 0);
  /// A trainable weight of `elems` elements; returns its index for fwd().
  std::size_t param(const std::string& name, std::uint64_t elems, std::int32_t layer);
  /// A new activation of `elems` elements (written by the fwd() that lists it as output).
  tensor_id act(const std::string& name, std::uint64_t elems);

  struct fwd_op {
    std::string name;
    std::string category;
    std::int32_t layer = -1;
    std::vector<tensor_id> ins;      ///< activations read
    std::vector<std::size_t> params;  ///< weights read
    std::vector<tensor_id> outs;     ///< activations written
    std::vector<tensor_id> saved;    ///< what the backward op reads besides output gradients
    double flops = 0;
    double bwd_flops = 0;
    std::uint64_t workspace_bytes = 0;  ///< cuDNN-style scratch, forward and backward
    /// An add: its backward hands the output's gradient to each input as it is (Note [Adds
    /// pass their gradient on] in zoo_builder.cpp).
    bool passes_grad = false;
  };
  void fwd(fwd_op op);
  /// Fused softmax cross-entropy: reads logits and labels, writes the loss and the logits'
  /// gradient (the backward pass starts from it).
  void loss(const std::string& name, tensor_id logits, tensor_id labels, std::int32_t layer);

  /// Emits backward in reverse, the clipping op when asked, and one Adam op per weight (each
  /// host_capable: Note [Host ops] in prefetch/plan.hpp); returns the validated trace.
  trace finish();

  std::uint32_t act_bytes() const { return act_bytes_; }

 private:
  struct param_info {
    tensor_id w, g, m, v, master;
    std::uint64_t elems;
    std::int32_t layer;
  };
  std::uint64_t op_bytes(const op_desc& op, std::uint64_t extra) const;
  tensor_id workspace(const std::string& name, std::uint64_t bytes);

  trace t_;
  std::uint32_t act_bytes_;
  bool mixed_;
  bool clip_;
  std::vector<param_info> params_;
  std::vector<fwd_op> fwd_;
  std::vector<char> no_grad_;
  tensor_id loss_logits_ = 0, loss_grad_ = 0;
  bool have_loss_ = false;
};

}  // namespace spillway::offload::detail
