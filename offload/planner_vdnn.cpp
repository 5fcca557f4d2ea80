// vdnn: vDNN (Rhu et al., "vDNN: Virtualized Deep Neural Networks for Scalable,
// Memory-Efficient Neural Network Design", MICRO 2016): in the forward pass offload each
// layer's input activations to the host; in the backward pass prefetch them one layer ahead.
// vdnn-all offloads every layer; vdnn-conv only conv layers (for transformer traces the
// linear layers, category "matmul", play that role). Weights stay resident.
#include <algorithm>

#include "offload/plan_builder.hpp"
#include "offload/planner.hpp"

namespace spillway::offload::detail {

namespace {

// First op of the backward segment that runs just before the segment holding op `use`
// (segments are runs of consecutive ops with the same layer number).
op_index one_layer_ahead(const trace& t, op_index use) {
  auto seg_start = [&](op_index k) {
    while (k > 0 && t.ops[k - 1].layer == t.ops[k].layer) --k;
    return k;
  };
  const op_index s = seg_start(use);
  if (s == 0) return 0;
  if (t.ops[use].layer < 0) return use > 0 ? use - 1 : 0;
  return seg_start(s - 1);
}

class vdnn_planner final : public planner {
 public:
  explicit vdnn_planner(bool conv_only) : conv_only_(conv_only) {}
  std::string name() const override { return conv_only_ ? "vdnn-conv" : "vdnn-all"; }

 private:
  plan do_make_plan(const trace& t, const lifetime_report& r, const hw_profile&, std::uint64_t budget) const override {
    std::vector<off_interval> out;
    std::vector<char> done(t.tensors.size(), 0);
    for (op_index k = 0; k < t.ops.size(); ++k) {
      const auto& op = t.ops[k];
      if (op.phase != op_phase::forward) continue;
      if (conv_only_ && op.category != "conv" && op.category != "matmul") continue;
      for (tensor_id x : op.reads) {
        if (done[x] || t.tensors[x].kind != tensor_kind::activation) continue;
        // The gap that leaves the forward pass: last forward use -> first backward use.
        for (const auto& g : r.tensors[x].gaps) {
          if (g.wraps || g.after < k || t.ops[g.before].phase != op_phase::backward) continue;
          if (t.ops[g.after].phase != op_phase::forward) continue;
          off_interval iv{x, g.after, g.before, g.before, tier::host, false};
          if (g.contents_needed) iv.issue = std::clamp(one_layer_ahead(t, g.before), g.after + 1, g.before);
          out.push_back(iv);
          done[x] = 1;
          break;
        }
      }
    }
    return build_plan(t, r, std::move(out), name(), budget);
  }

  bool conv_only_;
};

}  // namespace

std::unique_ptr<planner> make_vdnn_planner(bool conv_only) { return std::make_unique<vdnn_planner>(conv_only); }

}  // namespace spillway::offload::detail
