// Zoo builder: forward ops go straight into the trace; finish() walks them in reverse to emit
// the backward pass, then appends one Adam op per weight.
#include "offload/zoo_builder.hpp"

#include <algorithm>
#include <optional>

namespace spillway::offload::detail {

namespace {
void add_unique(std::vector<tensor_id>& v, tensor_id x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}
constexpr std::int64_t no_grad = -1;
}  // namespace

model_builder::model_builder(std::uint32_t act_bytes, bool mixed, bool clip)
    : act_bytes_(act_bytes), mixed_(mixed), clip_(clip) {}

tensor_id model_builder::input(const std::string& name, std::uint64_t elems, std::uint32_t elem_bytes) {
  const auto x = t_.add_tensor(name, elems * (elem_bytes ? elem_bytes : act_bytes_), tensor_kind::activation);
  no_grad_.resize(t_.tensors.size(), 0);
  no_grad_[x] = 1;
  op_desc op;
  op.name = "load." + name;
  op.writes = {x};
  op.bytes = t_.tensors[x].bytes;
  op.phase = op_phase::forward;
  op.category = "input";
  t_.add_op(std::move(op));
  return x;
}

std::size_t model_builder::param(const std::string& name, std::uint64_t elems, std::int32_t layer) {
  param_info p{};
  p.elems = elems;
  p.layer = layer;
  p.w = t_.add_tensor(name, elems * act_bytes_, tensor_kind::parameter);
  p.g = t_.add_tensor(name + ".grad", elems * act_bytes_, tensor_kind::gradient);
  p.m = t_.add_tensor(name + ".adam_m", elems * 4, tensor_kind::optimizer_state);
  p.v = t_.add_tensor(name + ".adam_v", elems * 4, tensor_kind::optimizer_state);
  p.master = mixed_ ? t_.add_tensor(name + ".master", elems * 4, tensor_kind::optimizer_state) : p.w;
  params_.push_back(p);
  return params_.size() - 1;
}

tensor_id model_builder::act(const std::string& name, std::uint64_t elems) {
  return t_.add_tensor(name, elems * act_bytes_, tensor_kind::activation);
}

tensor_id model_builder::workspace(const std::string& name, std::uint64_t bytes) {
  return t_.add_tensor(name, bytes, tensor_kind::workspace);
}

std::uint64_t model_builder::op_bytes(const op_desc& op, std::uint64_t extra) const {
  std::uint64_t b = extra;
  for (auto x : op.reads) b += t_.tensors[x].bytes;
  for (auto x : op.writes) b += t_.tensors[x].bytes;
  return b;
}

void model_builder::fwd(fwd_op f) {
  op_desc op;
  op.name = f.name;
  op.category = f.category;
  op.layer = f.layer;
  op.phase = op_phase::forward;
  op.flops = f.flops;
  op.recomputable = true;  // a forward op reads its inputs and weights and writes new activations
  for (auto x : f.ins) add_unique(op.reads, x);
  for (auto p : f.params) add_unique(op.reads, params_[p].w);
  for (auto x : f.outs) add_unique(op.writes, x);
  if (f.workspace_bytes) op.writes.push_back(workspace("ws." + f.name, f.workspace_bytes));
  op.bytes = op_bytes(op, 0);
  t_.add_op(std::move(op));
  fwd_.push_back(std::move(f));
}

void model_builder::loss(const std::string& name, tensor_id logits, tensor_id labels, std::int32_t layer) {
  const auto out = t_.add_tensor(name + ".value", 4, tensor_kind::activation);
  loss_logits_ = logits;
  loss_grad_ = t_.add_tensor("d." + t_.tensors[logits].name, t_.tensors[logits].bytes, tensor_kind::activation);
  have_loss_ = true;
  op_desc op;
  op.name = name;
  op.category = "loss";
  op.layer = layer;
  op.phase = op_phase::forward;
  op.reads = {logits, labels};
  op.writes = {out, loss_grad_};
  op.flops = 5.0 * static_cast<double>(t_.tensors[logits].bytes / act_bytes_);
  op.bytes = op_bytes(op, 0);
  t_.add_op(std::move(op));
}

// Note [Adds pass their gradient on]
// The gradient of y = a + b is dy for a and for b alike, and autograd hands both branches the
// same tensor instead of copying it. So an add's backward writes nothing: an input without a
// gradient yet takes the output's gradient tensor as its own, and an input that already has one
// (it also feeds an op after the add) gets the output's gradient added into it. The skip input
// of a residual block also feeds the block's first op; that op's backward, the last of the
// block, adds its share into the shared tensor after the branch's ops have read it, as
// autograd's in-place accumulation does. Writing two fresh gradients instead would hold three
// block-sized tensors at once where a framework holds one: at ResNet-50's first stage, two
// 198 MB tensors more than PyTorch allocates there.
trace model_builder::finish() {
  std::vector<std::int64_t> grad(t_.tensors.size(), no_grad);
  no_grad_.resize(t_.tensors.size(), 0);
  if (have_loss_) grad[loss_logits_] = loss_grad_;
  std::vector<char> param_grad_written(params_.size(), 0);
  // The order the parameters' gradients are last written in (the optimizer's order below).
  std::vector<std::size_t> grads_done;
  for (auto it = fwd_.rbegin(); it != fwd_.rend(); ++it) {
    const auto& f = *it;
    op_desc op;
    op.name = f.name + ".bwd";
    op.category = f.category;
    op.layer = f.layer;
    op.phase = op_phase::backward;
    op.flops = f.bwd_flops;
    for (auto o : f.outs)
      if (o < grad.size() && grad[o] != no_grad) add_unique(op.reads, static_cast<tensor_id>(grad[o]));
    if (op.reads.empty()) continue;  // nothing downstream needs this op's outputs
    for (auto s : f.saved) add_unique(op.reads, s);
    for (auto p : f.params) add_unique(op.reads, params_[p].w);
    for (auto in : f.ins) {
      if (in < no_grad_.size() && no_grad_[in]) continue;
      if (grad[in] != no_grad) {  // several consumers: accumulate
        add_unique(op.reads, static_cast<tensor_id>(grad[in]));
        add_unique(op.writes, static_cast<tensor_id>(grad[in]));
      } else if (f.passes_grad) {  // Note [Adds pass their gradient on]
        grad[in] = op.reads.front();
      } else {
        const auto g = t_.add_tensor("d." + t_.tensors[in].name, t_.tensors[in].bytes, tensor_kind::activation);
        grad.resize(t_.tensors.size(), no_grad);
        grad[in] = g;
        add_unique(op.writes, g);
      }
    }
    for (auto p : f.params) {
      const auto g = params_[p].g;
      if (param_grad_written[p]) add_unique(op.reads, g);
      add_unique(op.writes, g);
      param_grad_written[p] = 1;
    }
    if (f.workspace_bytes) op.writes.push_back(workspace("ws." + op.name, f.workspace_bytes));
    grad.resize(t_.tensors.size(), no_grad);
    if (f.passes_grad && op.writes.empty()) continue;  // each input took the gradient as it is
    op.bytes = op_bytes(op, 0);
    t_.add_op(std::move(op));
    for (auto p : f.params) {
      std::erase(grads_done, p);
      grads_done.push_back(p);
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i)  // parameters the loss does not reach
    if (!param_grad_written[i]) grads_done.push_back(i);
  // Global-norm clipping: one op reads every gradient and writes the norm each step reads.
  std::optional<tensor_id> norm;
  if (clip_ && !params_.empty()) {
    norm = t_.add_tensor("grad_norm", 4, tensor_kind::activation);
    op_desc op;
    op.name = "clip.grad_norm";
    op.category = "optimizer";
    op.phase = op_phase::optimizer;
    double elems = 0;
    for (const auto& p : params_) {
      op.reads.push_back(p.g);
      elems += static_cast<double>(p.elems);
    }
    op.writes = {*norm};
    op.flops = 2.0 * elems;
    op.bytes = op_bytes(op, 0);
    op.host_capable = true;
    op.host_flops = op.flops;
    op.host_bytes = op.bytes;
    t_.add_op(std::move(op));
  }
  // One step per parameter, in the order their gradients are done, as a loop that steps each
  // parameter once its gradient is final (an optimizer hooked into the backward pass) issues
  // them: an optimizer on the host then works in the order its inputs arrive.
  for (auto i : grads_done) {
    const auto& p = params_[i];
    op_desc op;
    op.name = "adam." + t_.tensors[p.w].name;
    op.category = "optimizer";
    op.layer = p.layer;
    op.phase = op_phase::optimizer;
    op.reads = {p.w, p.g, p.m, p.v};
    if (mixed_) op.reads.push_back(p.master);
    op.writes = {p.w, p.m, p.v};
    if (mixed_) op.writes.push_back(p.master);
    if (norm) op.reads.push_back(*norm);
    op.flops = 12.0 * static_cast<double>(p.elems);
    op.bytes = op_bytes(op, 0);
    // On the host (Note [Host ops]): the 16-bit weights are only written (the step reads the
    // fp32 master), so host memory moves the gradient, master, m and v in, master, m, v and
    // the weights out: 28 bytes per parameter in mixed precision, as many in fp32.
    op.host_capable = true;
    op.host_flops = op.flops;
    op.host_bytes = op.bytes - (mixed_ ? t_.tensors[p.w].bytes : 0);
    t_.add_op(std::move(op));
  }
  t_.validate();
  return std::move(t_);
}

}  // namespace spillway::offload::detail
