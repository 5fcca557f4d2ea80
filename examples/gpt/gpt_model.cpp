// The GPT example's forward, backward and Adam steps as Session ops, one op per kernel group,
// each transient released after its last use.
#include "examples/gpt/gpt_model.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "device/error.hpp"
#include "examples/common/device_io.hpp"
#include "examples/common/loss_value.hpp"
#include "examples/common/names.hpp"
#include "examples/common/parameters.hpp"
#include "examples/common/random.hpp"
#include "examples/gpt/corpus.hpp"
#include "kernels/kernels.hpp"

namespace spillway::examples {

namespace k = spillway::kernels;

gpt_shape gpt_preset(preset p) {
  switch (p) {
    case preset::tiny: return {256, 16, 32, 2, 2, 2};
    case preset::small: return {256, 128, 256, 8, 8, 8};
    case preset::medium: return {256, 256, 768, 12, 12, 8};
    case preset::large: return {256, 512, 1600, 25, 24, 8};
  }
  return {};
}

namespace {

constexpr std::uint64_t f32 = sizeof(float);
constexpr std::uint64_t i32 = sizeof(std::int32_t);

struct block_params {
  parameter ln1_g, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_g, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

// What a layer norm's forward kept for its backward: its input, mean and rstd.
struct norm_saved {
  tensor_handle x, mean, rstd;
};

// Forward activations of one block that backward reads.
struct block_acts {
  tensor_handle x_in, ln1, ln1_mean, ln1_rstd, qkv, att, probs, x_mid, ln2, ln2_mean, ln2_rstd, fc_pre, fc_act;
};

// Elem: the storage type of weights, activations and gradients (float, or kernels::bf16 in
// mixed precision; Note [Mixed precision] in examples/common/precision.hpp).
template <class Elem>
class gpt_model final : public model {
 public:
  gpt_model(const gpt_shape& shape, std::uint64_t seed, std::shared_ptr<const std::string> corpus,
            const batch_shares& shares)
      : sh_(shape), seed_(seed), corpus_(std::move(corpus)),
        params_(std::is_same_v<Elem, k::bf16> ? precision::bf16 : precision::fp32, shares) {
    if (sh_.heads <= 0 || sh_.channels % sh_.heads != 0)
      throw config_error("gpt shape: channels " + std::to_string(sh_.channels) + " must be a multiple of heads " +
                         std::to_string(sh_.heads));
    if (corpus_->size() <= static_cast<std::size_t>(sh_.seq) + 1)
      throw config_error("gpt: the corpus has " + std::to_string(corpus_->size()) + " bytes, not more than one sequence (" +
                         std::to_string(sh_.seq) + " + 1)");
  }

  void build(Session& s) override {
    ctx_ = std::make_unique<k::kernel_context>(s.device());
    const int c = sh_.channels;
    const std::size_t cc = static_cast<std::size_t>(c);
    rng r(seed_, 1);
    auto normal = [&](std::size_t n, double sd) { return normal_values(r, n, sd); };
    auto fill = [](std::size_t n, float v) { return std::vector<float>(n, v); };
    const double proj_sd = 0.02 / std::sqrt(2.0 * sh_.layers);
    wte_ = params_.add(s, "wte", normal(static_cast<std::size_t>(sh_.vocab) * cc, 0.02));
    wpe_ = params_.add(s, "wpe", normal(static_cast<std::size_t>(sh_.seq) * cc, 0.01));
    for (int l = 0; l < sh_.layers; ++l) {
      const std::string p = indexed("h", l);
      block_params b;
      b.ln1_g = params_.add(s, p + "ln1.gamma", fill(cc, 1.0f));
      b.ln1_b = params_.add(s, p + "ln1.beta", fill(cc, 0.0f));
      b.qkv_w = params_.add(s, p + "qkv.weight", normal(3 * cc * cc, 0.02));
      b.qkv_b = params_.add(s, p + "qkv.bias", fill(3 * cc, 0.0f));
      b.proj_w = params_.add(s, p + "proj.weight", normal(cc * cc, proj_sd));
      b.proj_b = params_.add(s, p + "proj.bias", fill(cc, 0.0f));
      b.ln2_g = params_.add(s, p + "ln2.gamma", fill(cc, 1.0f));
      b.ln2_b = params_.add(s, p + "ln2.beta", fill(cc, 0.0f));
      b.fc_w = params_.add(s, p + "fc.weight", normal(4 * cc * cc, 0.02));
      b.fc_b = params_.add(s, p + "fc.bias", fill(4 * cc, 0.0f));
      b.fcproj_w = params_.add(s, p + "fcproj.weight", normal(4 * cc * cc, proj_sd));
      b.fcproj_b = params_.add(s, p + "fcproj.bias", fill(cc, 0.0f));
      blocks_.push_back(b);
    }
    lnf_g_ = params_.add(s, "lnf.gamma", fill(cc, 1.0f));
    lnf_b_ = params_.add(s, "lnf.beta", fill(cc, 0.0f));
    loss_.add(s);
  }

  float train_step(Session& s, std::int64_t step) override;
  void pass(Session& s, std::int64_t step, int micro_batch);

  [[nodiscard]] std::uint64_t parameter_count() const override { return params_.count(); }
  [[nodiscard]] gradient_exchange::stats exchange_stats() const override { return params_.exchange_stats(); }
  [[nodiscard]] const batch_shares* shares() const override { return &params_.shares(); }
  [[nodiscard]] std::string describe() const override {
    return "gpt: " + std::to_string(sh_.layers) + " layers, " + std::to_string(sh_.channels) + " channels, " +
           std::to_string(sh_.heads) + " heads, vocab " + std::to_string(sh_.vocab) + ", batch " +
           std::to_string(sh_.batch) + " x " + std::to_string(sh_.seq) + " tokens, corpus " +
           std::to_string(corpus_->size()) + " bytes, " +
           to_string(params_.format());
  }

 private:
  void load_batch(std::int64_t step, int micro_batch);

  gpt_shape sh_;
  std::uint64_t seed_;
  std::shared_ptr<const std::string> corpus_;
  std::unique_ptr<k::kernel_context> ctx_;
  parameter_set params_;
  loss_value loss_;
  parameter wte_, wpe_, lnf_g_, lnf_b_;
  std::vector<block_params> blocks_;
  std::vector<std::int32_t> batch_;  // tokens, targets, positions; read by the upload op
  pinned_staging staging_;
};

template <class Elem>
void gpt_model<Elem>::load_batch(std::int64_t step, int micro_batch) {
  const std::size_t bt = static_cast<std::size_t>(sh_.batch) * static_cast<std::size_t>(sh_.seq);
  batch_.assign(3 * bt, 0);
  rng r(seed_, 2, static_cast<std::uint64_t>(step));
  const std::size_t starts = corpus_->size() - static_cast<std::size_t>(sh_.seq) - 1;
  // The step's whole batch is drawn; this micro-batch keeps its rows (Note [Micro-batches]).
  const int first_row = micro_batch * sh_.batch;
  for (int g = 0; g < sh_.batch * params_.shares().count; ++g) {
    const std::size_t off = r.below(starts + 1);
    const int b = g - first_row;
    if (b < 0 || b >= sh_.batch) continue;
    for (int t = 0; t < sh_.seq; ++t) {
      const std::size_t i = static_cast<std::size_t>(b) * static_cast<std::size_t>(sh_.seq) + static_cast<std::size_t>(t);
      batch_[i] = static_cast<unsigned char>((*corpus_)[off + static_cast<std::size_t>(t)]);
      batch_[bt + i] = static_cast<unsigned char>((*corpus_)[off + static_cast<std::size_t>(t) + 1]);
      batch_[2 * bt + i] = t;
    }
  }
}

template <class Elem>
float gpt_model<Elem>::train_step(Session& s, std::int64_t step) {
  return params_.train_step(
      s, *ctx_, step + 1, [&](int mb) { pass(s, step, mb); }, [&] { return loss_.read(s); },
      k::adam_config{1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f}, sh_.clip_grad_norm);
}

template <class Elem>
void gpt_model<Elem>::pass(Session& s, std::int64_t step, int micro_batch) {
  const int B = sh_.batch, T = sh_.seq, C = sh_.channels, H = sh_.heads, V = sh_.vocab, L = sh_.layers;
  const int BT = B * T;
  const std::uint64_t bt = static_cast<std::uint64_t>(BT);
  constexpr std::uint64_t et = sizeof(Elem);  // bytes of a weight, activation or gradient element
  const std::uint64_t act = bt * static_cast<std::uint64_t>(C) * et;  // one [BT, C] activation
  const std::uint64_t probs_bytes = static_cast<std::uint64_t>(B) * H * T * T * et;
  const double dbt = BT, dc = C;
  k::kernel_context& ctx = *ctx_;
  // bf16 GEMMs need a workspace on the cpu backend (their operands widened to fp32); fp32 ones
  // need none, so in fp32 these are 0 and the ops keep their tensor lists.
  constexpr bool half = std::is_same_v<Elem, k::bf16>;
  const auto linear_ws = [&](int in, int out) -> std::size_t {
    return half ? k::linear_bf16_workspace_bytes(ctx, BT, in, out) : 0;
  };
  const std::size_t attention_ws = half ? k::attention_bf16_workspace_bytes(ctx, {B, T, C, H}) : 0;

  // ---- batch ----
  load_batch(step, micro_batch);
  auto tokens = s.add_transient("tokens", bt * i32);
  auto targets = s.add_transient("targets", bt * i32);
  auto positions = s.add_transient("positions", bt * i32);
  {
    auto op = s.op("batch.upload", {}, {tokens, targets, positions});
    staging_.upload(op.device(), op.stream(),
                    {{op.ptr(tokens), batch_.data(), bt * i32},
                     {op.ptr(targets), batch_.data() + bt, bt * i32},
                     {op.ptr(positions), batch_.data() + 2 * bt, bt * i32}});
  }

  // ---- forward ----
  auto x = s.add_transient("x0", act);
  // Forward ops are recomputable (Session::recomputable_op): a plan may drop what they write and
  // run them again before the backward pass reads it. Each body captures handles by value.
  s.recomputable_op("embed.forward", {wte_.value, wpe_.value, tokens, positions}, {x},
                    [=, this, &ctx](const Session::op_scope& op) {
                      k::embedding_forward(ctx, op.stream(), op.ptr<std::int32_t>(tokens), op.ptr<Elem>(wte_.value),
                                           op.ptr<Elem>(x), BT, V, C);
                      k::embedding_forward(ctx, op.stream(), op.ptr<std::int32_t>(positions), op.ptr<Elem>(wpe_.value),
                                           op.ptr<Elem>(x), BT, T, C, /*accumulate=*/true);
                    });
  std::vector<block_acts> acts(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) {
    const block_params& p = blocks_[static_cast<std::size_t>(l)];
    block_acts& a = acts[static_cast<std::size_t>(l)];
    const std::string n = indexed("h", l);
    a.x_in = x;
    a.ln1 = s.add_transient(n + "ln1.out", act);
    a.ln1_mean = s.add_transient(n + "ln1.mean", bt * f32);
    a.ln1_rstd = s.add_transient(n + "ln1.rstd", bt * f32);
    s.recomputable_op(n + "ln1.forward", {x, p.ln1_g.value, p.ln1_b.value}, {a.ln1, a.ln1_mean, a.ln1_rstd}, [=, &ctx](const Session::op_scope& op) {
        k::layer_norm_forward(ctx, op.stream(), op.ptr<Elem>(x), op.ptr<Elem>(p.ln1_g.value), op.ptr<Elem>(p.ln1_b.value),
                              op.ptr<Elem>(a.ln1), op.ptr<float>(a.ln1_mean), op.ptr<float>(a.ln1_rstd), BT, C);
      }, 8 * dbt * dc);
    a.qkv = s.add_transient(n + "qkv.out", 3 * act);
    const optional_workspace qkv_ws(s, n + "qkv.forward.workspace", linear_ws(C, 3 * C));
    s.recomputable_op(n + "qkv.forward", tensors({a.ln1, p.qkv_w.value, p.qkv_b.value}), qkv_ws.with({a.qkv}), [=, &ctx](const Session::op_scope& op) {
        const auto bound = qkv_ws.bind(op, ctx);
        k::linear_forward(ctx, op.stream(), op.ptr<Elem>(a.ln1), op.ptr<Elem>(p.qkv_w.value), op.ptr<Elem>(p.qkv_b.value),
                          op.ptr<Elem>(a.qkv), BT, C, 3 * C);
      }, 2 * dbt * dc * 3 * dc);
    qkv_ws.release(s);
    a.att = s.add_transient(n + "attn.out", act);
    a.probs = s.add_transient(n + "attn.probs", probs_bytes);
    const optional_workspace attn_ws(s, n + "attn.forward.workspace", attention_ws);
    s.recomputable_op(n + "attn.forward", tensors({a.qkv}), attn_ws.with({a.att, a.probs}), [=, &ctx](const Session::op_scope& op) {
        const auto bound = attn_ws.bind(op, ctx);
        k::attention_forward(ctx, op.stream(), {B, T, C, H}, op.ptr<Elem>(a.qkv), op.ptr<Elem>(a.att),
                             op.ptr<Elem>(a.probs));
      }, 4.0 * B * T * T * dc);
    attn_ws.release(s);
    a.x_mid = s.add_transient(n + "resid.mid", act);
    const optional_workspace proj_ws(s, n + "proj.forward.workspace", linear_ws(C, C));
    s.recomputable_op(n + "proj.forward", tensors({a.att, p.proj_w.value, p.proj_b.value, x}), proj_ws.with({a.x_mid}), [=, &ctx](const Session::op_scope& op) {
        const auto bound = proj_ws.bind(op, ctx);
        k::linear_forward(ctx, op.stream(), op.ptr<Elem>(a.att), op.ptr<Elem>(p.proj_w.value),
                          op.ptr<Elem>(p.proj_b.value), op.ptr<Elem>(a.x_mid), BT, C, C);
        k::add(ctx, op.stream(), op.ptr<Elem>(a.x_mid), op.ptr<Elem>(x), op.ptr<Elem>(a.x_mid), bt * C);
      }, 2 * dbt * dc * dc);
    proj_ws.release(s);
    a.ln2 = s.add_transient(n + "ln2.out", act);
    a.ln2_mean = s.add_transient(n + "ln2.mean", bt * f32);
    a.ln2_rstd = s.add_transient(n + "ln2.rstd", bt * f32);
    s.recomputable_op(n + "ln2.forward", {a.x_mid, p.ln2_g.value, p.ln2_b.value}, {a.ln2, a.ln2_mean, a.ln2_rstd}, [=, &ctx](const Session::op_scope& op) {
        k::layer_norm_forward(ctx, op.stream(), op.ptr<Elem>(a.x_mid), op.ptr<Elem>(p.ln2_g.value),
                              op.ptr<Elem>(p.ln2_b.value), op.ptr<Elem>(a.ln2), op.ptr<float>(a.ln2_mean),
                              op.ptr<float>(a.ln2_rstd), BT, C);
      }, 8 * dbt * dc);
    a.fc_pre = s.add_transient(n + "fc.pre", 4 * act);
    a.fc_act = s.add_transient(n + "fc.gelu", 4 * act);
    const optional_workspace fc_ws(s, n + "fc.forward.workspace", linear_ws(C, 4 * C));
    s.recomputable_op(n + "fc.forward", tensors({a.ln2, p.fc_w.value, p.fc_b.value}), fc_ws.with({a.fc_pre, a.fc_act}), [=, &ctx](const Session::op_scope& op) {
        const auto bound = fc_ws.bind(op, ctx);
        k::linear_forward(ctx, op.stream(), op.ptr<Elem>(a.ln2), op.ptr<Elem>(p.fc_w.value), op.ptr<Elem>(p.fc_b.value),
                          op.ptr<Elem>(a.fc_pre), BT, C, 4 * C);
        k::gelu_forward(ctx, op.stream(), op.ptr<Elem>(a.fc_pre), op.ptr<Elem>(a.fc_act), 4 * bt * C);
      }, 8 * dbt * dc * dc);
    fc_ws.release(s);
    auto x_next = s.add_transient(n + "resid.out", act);
    const optional_workspace fcproj_ws(s, n + "fcproj.forward.workspace", linear_ws(4 * C, C));
    s.recomputable_op(n + "fcproj.forward", tensors({a.fc_act, p.fcproj_w.value, p.fcproj_b.value, a.x_mid}), fcproj_ws.with({x_next}), [=, &ctx](const Session::op_scope& op) {
        const auto bound = fcproj_ws.bind(op, ctx);
        k::linear_forward(ctx, op.stream(), op.ptr<Elem>(a.fc_act), op.ptr<Elem>(p.fcproj_w.value),
                          op.ptr<Elem>(p.fcproj_b.value), op.ptr<Elem>(x_next), BT, 4 * C, C);
        k::add(ctx, op.stream(), op.ptr<Elem>(x_next), op.ptr<Elem>(a.x_mid), op.ptr<Elem>(x_next), bt * C);
      }, 8 * dbt * dc * dc);
    fcproj_ws.release(s);
    x = x_next;
  }
  auto lnf = s.add_transient("lnf.out", act);
  auto lnf_mean = s.add_transient("lnf.mean", bt * f32);
  auto lnf_rstd = s.add_transient("lnf.rstd", bt * f32);
  s.recomputable_op("lnf.forward", {x, lnf_g_.value, lnf_b_.value}, {lnf, lnf_mean, lnf_rstd}, [=, this, &ctx](const Session::op_scope& op) {
      k::layer_norm_forward(ctx, op.stream(), op.ptr<Elem>(x), op.ptr<Elem>(lnf_g_.value), op.ptr<Elem>(lnf_b_.value),
                            op.ptr<Elem>(lnf), op.ptr<float>(lnf_mean), op.ptr<float>(lnf_rstd), BT, C);
    }, 8 * dbt * dc);
  auto logits = s.add_transient("head.logits", bt * static_cast<std::uint64_t>(V) * et);
  const optional_workspace head_ws(s, "head.forward.workspace", linear_ws(C, V));
  s.recomputable_op("head.forward", tensors({lnf, wte_.value}), head_ws.with({logits}), [=, this, &ctx](const Session::op_scope& op) {
      const auto bound = head_ws.bind(op, ctx);
      k::linear_forward(ctx, op.stream(), op.ptr<Elem>(lnf), op.ptr<Elem>(wte_.value), nullptr, op.ptr<Elem>(logits),
                        BT, C, V);
    }, 2 * dbt * dc * V);
  head_ws.release(s);
  const tensor_handle loss = loss_.handle();
  const op_workspace loss_ws(s, "loss.workspace", k::softmax_cross_entropy_workspace_bytes(BT));
  {
    // The logits become d loss / d logits in place.
    auto op = s.op("loss.forward", {logits, targets}, {logits, loss, loss_ws.handle()}, 5 * dbt * V);
    const auto bound = loss_ws.bind(op, ctx);
    k::softmax_cross_entropy(ctx, op.stream(), op.ptr<Elem>(logits), op.ptr<std::int32_t>(targets), nullptr,
                             op.ptr<float>(loss), op.ptr<Elem>(logits), BT, V, 1.0f / static_cast<float>(BT));
  }
  loss_ws.release(s);
  s.release(targets);

  // ---- backward ----
  // A block's layer norm backward, with the residual stream's gradient added:
  // d_in = layer_norm'(d_out) + d_resid. `saved` is what the forward kept: its input, mean and rstd.
  auto norm_backward = [&](const std::string& name, const norm_saved& saved, const parameter& g, const parameter& b,
                           tensor_handle d_out, tensor_handle d_resid, tensor_handle d_in) {
    {
      auto op = s.op(name, {saved.x, g.value, saved.mean, saved.rstd, d_out, d_resid}, {d_in, g.grad, b.grad},
                     11 * dbt * dc);
      k::layer_norm_backward(ctx, op.stream(), op.ptr<Elem>(saved.x), op.ptr<Elem>(g.value), op.ptr<float>(saved.mean),
                             op.ptr<float>(saved.rstd), op.ptr<Elem>(d_out), op.ptr<Elem>(d_in), op.ptr<Elem>(g.grad),
                             op.ptr<Elem>(b.grad), BT, C, false);
      k::add(ctx, op.stream(), op.ptr<Elem>(d_in), op.ptr<Elem>(d_resid), op.ptr<Elem>(d_in), bt * C);
    }
    params_.gradient_ready(s, ctx, g);
    params_.gradient_ready(s, ctx, b);
  };
  // A block's linear layer backward: d_x = d_y w (in -> out features); w's and b's gradients
  // overwritten (every block has its own).
  auto linear_backward = [&](const std::string& name, tensor_handle x, const parameter& w, const parameter& b,
                             tensor_handle d_y, tensor_handle d_x, int in, int out, double flops) {
    const optional_workspace ws(s, name + ".workspace", linear_ws(in, out));
    {
      auto op = s.op(name, tensors({x, w.value, d_y}), ws.with({d_x, w.grad, b.grad}), flops);
      const auto bound = ws.bind(op, ctx);
      k::linear_backward(ctx, op.stream(), op.ptr<Elem>(x), op.ptr<Elem>(w.value), op.ptr<Elem>(d_y), op.ptr<Elem>(d_x),
                         op.ptr<Elem>(w.grad), op.ptr<Elem>(b.grad), BT, in, out, false);
    }
    ws.release(s);
    params_.gradient_ready(s, ctx, w);
    params_.gradient_ready(s, ctx, b);
  };
  auto d_lnf = s.add_transient("lnf.dout", act);
  const optional_workspace head_bwd_ws(s, "head.backward.workspace", linear_ws(C, V));
  {
    auto op = s.op("head.backward", tensors({lnf, wte_.value, logits}), head_bwd_ws.with({d_lnf, wte_.grad}),
                   4 * dbt * dc * V);
    const auto bound = head_bwd_ws.bind(op, ctx);
    k::linear_backward(ctx, op.stream(), op.ptr<Elem>(lnf), op.ptr<Elem>(wte_.value), op.ptr<Elem>(logits),
                       op.ptr<Elem>(d_lnf), op.ptr<Elem>(wte_.grad), nullptr, BT, C, V, /*accumulate=*/false);
  }
  head_bwd_ws.release(s);
  s.release(logits);
  s.release(lnf);
  auto dres = s.add_transient("lnf.dx", act);
  {
    auto op = s.op("lnf.backward", {x, lnf_g_.value, lnf_mean, lnf_rstd, d_lnf}, {dres, lnf_g_.grad, lnf_b_.grad},
                   10 * dbt * dc);
    k::layer_norm_backward(ctx, op.stream(), op.ptr<Elem>(x), op.ptr<Elem>(lnf_g_.value), op.ptr<float>(lnf_mean),
                           op.ptr<float>(lnf_rstd), op.ptr<Elem>(d_lnf), op.ptr<Elem>(dres),
                           op.ptr<Elem>(lnf_g_.grad), op.ptr<Elem>(lnf_b_.grad), BT, C, false);
  }
  params_.gradient_ready(s, ctx, lnf_g_);
  params_.gradient_ready(s, ctx, lnf_b_);
  for (auto t : {d_lnf, lnf_mean, lnf_rstd, x}) s.release(t);

  for (int l = L - 1; l >= 0; --l) {
    const block_params& p = blocks_[static_cast<std::size_t>(l)];
    const block_acts& a = acts[static_cast<std::size_t>(l)];
    const std::string n = indexed("h", l);
    auto d_fc = s.add_transient(n + "fc.dgelu", 4 * act);
    linear_backward(n + "fcproj.backward", a.fc_act, p.fcproj_w, p.fcproj_b, dres, d_fc, 4 * C, C, 16 * dbt * dc * dc);
    s.release(a.fc_act);
    auto d_ln2 = s.add_transient(n + "ln2.dout", act);
    const optional_workspace fc_bwd_ws(s, n + "fc.backward.workspace", linear_ws(C, 4 * C));
    {
      auto op = s.op(n + "fc.backward", tensors({a.fc_pre, a.ln2, p.fc_w.value, d_fc}),
                     fc_bwd_ws.with({d_fc, d_ln2, p.fc_w.grad, p.fc_b.grad}), 16 * dbt * dc * dc);
      const auto bound = fc_bwd_ws.bind(op, ctx);
      k::gelu_backward(ctx, op.stream(), op.ptr<Elem>(a.fc_pre), op.ptr<Elem>(d_fc), op.ptr<Elem>(d_fc), 4 * bt * C);
      k::linear_backward(ctx, op.stream(), op.ptr<Elem>(a.ln2), op.ptr<Elem>(p.fc_w.value), op.ptr<Elem>(d_fc),
                         op.ptr<Elem>(d_ln2), op.ptr<Elem>(p.fc_w.grad), op.ptr<Elem>(p.fc_b.grad), BT, C, 4 * C,
                         false);
    }
    fc_bwd_ws.release(s);
    params_.gradient_ready(s, ctx, p.fc_w);
    params_.gradient_ready(s, ctx, p.fc_b);
    for (auto t : {d_fc, a.fc_pre, a.ln2}) s.release(t);
    auto d_mid = s.add_transient(n + "resid.dmid", act);
    norm_backward(n + "ln2.backward", {a.x_mid, a.ln2_mean, a.ln2_rstd}, p.ln2_g, p.ln2_b, d_ln2, dres, d_mid);
    for (auto t : {dres, d_ln2, a.ln2_mean, a.ln2_rstd, a.x_mid}) s.release(t);
    dres = d_mid;
    auto d_att = s.add_transient(n + "attn.dout", act);
    linear_backward(n + "proj.backward", a.att, p.proj_w, p.proj_b, dres, d_att, C, C, 4 * dbt * dc * dc);
    s.release(a.att);
    auto d_qkv = s.add_transient(n + "qkv.dout", 3 * act);
    auto scratch = s.add_transient(n + "attn.scratch", probs_bytes, tensor_kind::workspace);
    const optional_workspace attn_bwd_ws(s, n + "attn.backward.workspace", attention_ws);
    {
      auto op = s.op(n + "attn.backward", tensors({a.qkv, a.probs, d_att}), attn_bwd_ws.with({d_qkv, scratch}),
                     8.0 * B * T * T * dc);
      const auto bound = attn_bwd_ws.bind(op, ctx);
      k::attention_backward(ctx, op.stream(), {B, T, C, H}, op.ptr<Elem>(a.qkv), op.ptr<Elem>(a.probs),
                            op.ptr<Elem>(d_att), op.ptr<Elem>(d_qkv), op.ptr<Elem>(scratch));
    }
    attn_bwd_ws.release(s);
    for (auto t : {scratch, a.probs, d_att}) s.release(t);
    auto d_ln1 = s.add_transient(n + "ln1.dout", act);
    linear_backward(n + "qkv.backward", a.ln1, p.qkv_w, p.qkv_b, d_qkv, d_ln1, C, 3 * C, 12 * dbt * dc * dc);
    for (auto t : {d_qkv, a.qkv, a.ln1}) s.release(t);
    auto d_in = s.add_transient(n + "resid.din", act);
    norm_backward(n + "ln1.backward", {a.x_in, a.ln1_mean, a.ln1_rstd}, p.ln1_g, p.ln1_b, d_ln1, dres, d_in);
    for (auto t : {dres, d_ln1, a.ln1_mean, a.ln1_rstd, a.x_in}) s.release(t);
    dres = d_in;
  }
  {
    // The tied head wrote wte's gradient; the token lookup adds to it.
    auto op = s.op("embed.backward", {tokens, positions, dres, wte_.grad}, {wte_.grad, wpe_.grad}, 2 * dbt * dc);
    k::embedding_backward(ctx, op.stream(), op.ptr<std::int32_t>(tokens), op.ptr<Elem>(dres), op.ptr<Elem>(wte_.grad),
                          BT, V, C, /*accumulate=*/true);
    k::embedding_backward(ctx, op.stream(), op.ptr<std::int32_t>(positions), op.ptr<Elem>(dres),
                          op.ptr<Elem>(wpe_.grad), BT, T, C, /*accumulate=*/false);
  }
  params_.gradient_ready(s, ctx, wte_);
  params_.gradient_ready(s, ctx, wpe_);
  for (auto t : {tokens, positions, dres}) s.release(t);
}

}  // namespace

std::unique_ptr<model> make_gpt(const gpt_shape& shape, std::uint64_t seed, std::shared_ptr<const std::string> corpus,
                                precision p, const batch_shares& shares) {
  if (p == precision::bf16) return std::make_unique<gpt_model<k::bf16>>(shape, seed, std::move(corpus), shares);
  return std::make_unique<gpt_model<float>>(shape, seed, std::move(corpus), shares);
}

std::unique_ptr<model> make_gpt(const example_options& o) {
  gpt_shape shape = gpt_preset(o.size);
  shape.clip_grad_norm = static_cast<float>(o.clip_grad_norm);
  auto corpus = std::make_shared<const std::string>(
      o.data.empty() ? generate_corpus(o.seed, 64 * 1024) : load_corpus(o.data, static_cast<std::size_t>(shape.seq) + 2));
  const batch_shares shares = batch_shares::from(o);
  shape.batch = shares.micro_batch(shape.batch);
  return make_gpt(shape, o.seed, std::move(corpus), o.prec, shares);
}

run_result run_gpt(const example_options& o, const step_observer& on_step) {
  return train(o, [&] { return make_gpt(o); }, on_step);
}

}  // namespace spillway::examples
