// The CNN example's forward, backward and Adam steps as Session ops: residual blocks with the
// skip added before the ReLU, transitions by max pooling and a 1x1 convolution.
#include "examples/cnn/cnn_model.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "device/error.hpp"
#include "examples/cnn/images.hpp"
#include "examples/common/device_io.hpp"
#include "examples/common/loss_value.hpp"
#include "examples/common/names.hpp"
#include "examples/common/parameters.hpp"
#include "examples/common/random.hpp"
#include "kernels/kernels.hpp"

namespace spillway::examples {

namespace k = spillway::kernels;

cnn_shape cnn_preset(preset p) {
  switch (p) {
    case preset::tiny: return {2, 16, {8, 16}, 3, 4, 1e-3f};
    case preset::small: return {32, 32, {32, 64, 128, 256}, 3, 8, 3e-4f};
    case preset::medium: return {64, 64, {64, 128, 256, 512}, 5, 8, 3e-4f};
    case preset::large: return {128, 128, {64, 128, 256, 512, 1024}, 3, 8, 1e-4f};
  }
  return {};
}

namespace {

constexpr int in_channels = 3;

struct conv_param {
  parameter w, b;
  k::conv2d_shape shape;
  std::size_t workspace = 0;  ///< bytes its kernels need, forward and backward (Note [Workspace])
};

struct res_block {
  conv_param conv1, conv2;
};

struct stage {
  bool has_transition = false;  // max pool 2x2 then a 1x1 widening convolution
  k::pool2d_shape pool;
  conv_param widen;
  std::vector<res_block> blocks;
};

// Elem: the storage type of weights, activations and gradients (float, or kernels::bf16 in
// mixed precision; Note [Mixed precision] in examples/common/precision.hpp).
template <class Elem>
class cnn_model final : public model {
 public:
  cnn_model(const cnn_shape& shape, std::uint64_t seed, const batch_shares& shares)
      : sh_(shape), seed_(seed), params_(std::is_same_v<Elem, k::bf16> ? precision::bf16 : precision::fp32, shares) {
    if (sh_.stage_channels.empty() || sh_.classes < 2 || sh_.classes > image_pattern_count)
      throw config_error("cnn shape: " + std::to_string(sh_.stage_channels.size()) + " stages, " +
                         std::to_string(sh_.classes) + " classes; needs at least one stage and 2 to " +
                         std::to_string(image_pattern_count) + " classes");
    if ((sh_.image >> (sh_.stage_channels.size() - 1)) < 2)
      throw config_error("cnn shape: " + std::to_string(sh_.image) + "x" + std::to_string(sh_.image) + " images are too small for " +
                         std::to_string(sh_.stage_channels.size()) + " stages (each halves them; the last needs at least 2x2)");
  }

  void build(Session& s) override {
    ctx_ = std::make_unique<k::kernel_context>(s.device());
    rng r(seed_, 30);
    int c = sh_.stage_channels[0];
    int size = sh_.image;
    stem_ = add_conv(s, r, "stem", in_channels, c, 3, size, 1.0);
    for (std::size_t si = 0; si < sh_.stage_channels.size(); ++si) {
      stage st;
      const std::string n = indexed("s", si);
      if (si > 0) {
        st.has_transition = true;
        st.pool = {sh_.batch, c, size, size, {2, 2, 0}};
        size /= 2;
        st.widen = add_conv(s, r, n + "widen", c, sh_.stage_channels[si], 1, size, 1.0);
        c = sh_.stage_channels[si];
      }
      for (int b = 0; b < sh_.blocks_per_stage; ++b) {
        const std::string bn = n + indexed("b", b);
        res_block blk;
        blk.conv1 = add_conv(s, r, bn + "conv1", c, c, 3, size, 1.0);
        // The second convolution of a block starts small, so the block starts near identity.
        blk.conv2 = add_conv(s, r, bn + "conv2", c, c, 3, size, 0.2);
        st.blocks.push_back(blk);
      }
      stages_.push_back(st);
    }
    final_channels_ = c;
    final_plane_ = size * size;
    fc_w_ = params_.add(s, "fc.weight", normal_values(r, static_cast<std::size_t>(sh_.classes) * static_cast<std::size_t>(c),
                                                     1.0 / std::sqrt(c)));
    fc_b_ = params_.add(s, "fc.bias", std::vector<float>(static_cast<std::size_t>(sh_.classes), 0.0f));
    loss_.add(s);
  }

  float train_step(Session& s, std::int64_t step) override;
  void pass(Session& s, std::int64_t step, int micro_batch);

  [[nodiscard]] std::uint64_t parameter_count() const override { return params_.count(); }
  [[nodiscard]] gradient_exchange::stats exchange_stats() const override { return params_.exchange_stats(); }
  [[nodiscard]] const batch_shares* shares() const override { return &params_.shares(); }
  [[nodiscard]] std::string describe() const override {
    std::string ch;
    for (int c : sh_.stage_channels) {
      if (!ch.empty()) ch += '/';
      ch += std::to_string(c);
    }
    return "cnn: resnet-style, stages " + ch + " channels x " + std::to_string(sh_.blocks_per_stage) + " blocks, " +
           std::to_string(sh_.image) + "x" + std::to_string(sh_.image) + " images, batch " + std::to_string(sh_.batch) +
           ", " + std::to_string(sh_.classes) + " pattern classes, " + to_string(params_.format());
  }

 private:
  conv_param add_conv(Session& s, rng& r, const std::string& name, int cin, int cout, int kernel, int size, double gain) {
    conv_param p;
    p.shape = {sh_.batch, cin, size, size, cout, {kernel, 1, kernel / 2}};
    const std::size_t fan_in = static_cast<std::size_t>(cin) * static_cast<std::size_t>(kernel * kernel);
    p.w = params_.add(s, name + ".weight",
                      normal_values(r, static_cast<std::size_t>(cout) * fan_in, gain * std::sqrt(2.0 / static_cast<double>(fan_in))));
    p.b = params_.add(s, name + ".bias", std::vector<float>(static_cast<std::size_t>(cout), 0.0f));
    // Sized once, before training.
    if constexpr (std::is_same_v<Elem, k::bf16>)
      p.workspace = k::conv2d_bf16_workspace_bytes(*ctx_, p.shape);
    else
      p.workspace = k::conv2d_workspace_bytes(*ctx_, p.shape);
    return p;
  }

  static std::uint64_t out_bytes(const k::conv2d_shape& c) {
    return static_cast<std::uint64_t>(c.batch) * static_cast<std::uint64_t>(c.out_channels) *
           static_cast<std::uint64_t>(c.out_height()) * static_cast<std::uint64_t>(c.out_width()) * et;
  }
  static double flops(const k::conv2d_shape& c) {
    return 2.0 * c.batch * c.out_channels * c.out_height() * c.out_width() * c.in_channels * c.kernel.size * c.kernel.size;
  }

  static constexpr std::uint64_t et = sizeof(Elem);  // bytes of a weight, activation or gradient element

  cnn_shape sh_;
  std::uint64_t seed_;
  std::unique_ptr<k::kernel_context> ctx_;
  parameter_set params_;
  loss_value loss_;
  conv_param stem_;
  std::vector<stage> stages_;
  parameter fc_w_, fc_b_;
  int final_channels_ = 0, final_plane_ = 0;
  std::vector<float> pixels_;
  std::vector<Elem> pixels_stored_;  // pixels_ in the storage type, read by the upload op
  std::vector<std::int32_t> labels_;
  pinned_staging staging_;
};

// Forward tensors of one residual block that backward reads.
struct block_acts {
  tensor_handle x_in, a1, y;
};
struct stage_acts {
  tensor_handle x_in, pooled;  // transition only
  std::vector<block_acts> blocks;
};

template <class Elem>
float cnn_model<Elem>::train_step(Session& s, std::int64_t step) {
  return params_.train_step(
      s, *ctx_, step + 1, [&](int mb) { pass(s, step, mb); }, [&] { return loss_.read(s); },
      k::adam_config{sh_.lr, 0.9f, 0.999f, 1e-8f, 0.0f}, sh_.clip_grad_norm);
}

template <class Elem>
void cnn_model<Elem>::pass(Session& s, std::int64_t step, int micro_batch) {
  k::kernel_context& ctx = *ctx_;
  const int B = sh_.batch;
  // The step's whole batch is made; this micro-batch keeps its images (Note [Micro-batches]).
  const int shares = params_.shares().count;
  make_images(seed_, step, B * shares, in_channels, sh_.image, sh_.classes, pixels_, labels_);
  if (shares > 1) {
    const std::size_t per = pixels_.size() / static_cast<std::size_t>(shares);
    const auto mb = static_cast<std::size_t>(micro_batch);
    pixels_ = std::vector<float>(pixels_.begin() + static_cast<std::ptrdiff_t>(mb * per),
                                 pixels_.begin() + static_cast<std::ptrdiff_t>((mb + 1) * per));
    labels_ = std::vector<std::int32_t>(labels_.begin() + static_cast<std::ptrdiff_t>(mb * static_cast<std::size_t>(B)),
                                        labels_.begin() + static_cast<std::ptrdiff_t>((mb + 1) * static_cast<std::size_t>(B)));
  }
  pixels_stored_.resize(pixels_.size());
  for (std::size_t i = 0; i < pixels_.size(); ++i) pixels_stored_[i] = k::store_as<Elem>(pixels_[i]);
  auto images = s.add_transient("images", pixels_.size() * et);
  auto labels = s.add_transient("labels", labels_.size() * sizeof(std::int32_t));
  {
    auto op = s.op("batch.upload", {}, {images, labels});
    staging_.upload(op.device(), op.stream(),
                    {{op.ptr(images), pixels_stored_.data(), pixels_stored_.size() * et},
                     {op.ptr(labels), labels_.data(), labels_.size() * sizeof(std::int32_t)}});
  }

  // ---- forward ----
  // Forward ops are recomputable (Session::recomputable_op): a plan may drop what they write and
  // run them again before the backward pass reads it. Each body captures handles by value.
  auto x = s.add_transient("stem.out", out_bytes(stem_.shape));
  const op_workspace stem_ws(s, "stem.forward.workspace", stem_.workspace);
  s.recomputable_op("stem.forward", {images, stem_.w.value, stem_.b.value}, {x, stem_ws.handle()}, [=, this, &ctx](const Session::op_scope& op) {
    const auto bound = stem_ws.bind(op, ctx);
    k::conv2d_forward(ctx, op.stream(), stem_.shape, op.ptr<Elem>(images), op.ptr<Elem>(stem_.w.value),
                      op.ptr<Elem>(stem_.b.value), op.ptr<Elem>(x));
    k::relu_forward(ctx, op.stream(), op.ptr<Elem>(x), op.ptr<Elem>(x), out_bytes(stem_.shape) / et);
  }, flops(stem_.shape));
  stem_ws.release(s);
  const tensor_handle stem_out = x;
  std::vector<stage_acts> acts(stages_.size());
  for (std::size_t si = 0; si < stages_.size(); ++si) {
    const stage& st = stages_[si];
    stage_acts& sa = acts[si];
    const std::string n = indexed("s", si);
    if (st.has_transition) {
      sa.x_in = x;
      const std::uint64_t pooled_bytes = static_cast<std::uint64_t>(B) * st.pool.channels * st.pool.out_height() *
                                         st.pool.out_width() * et;
      sa.pooled = s.add_transient(n + "pool.out", pooled_bytes);
      s.recomputable_op(n + "pool.forward", {x}, {sa.pooled}, [=, &ctx](const Session::op_scope& op) {
        k::max_pool2d_forward(ctx, op.stream(), st.pool, op.ptr<Elem>(x), op.ptr<Elem>(sa.pooled));
      }, static_cast<double>(pooled_bytes));
      auto widened = s.add_transient(n + "widen.out", out_bytes(st.widen.shape));
      const op_workspace ws(s, n + "widen.forward.workspace", st.widen.workspace);
      s.recomputable_op(n + "widen.forward", {sa.pooled, st.widen.w.value, st.widen.b.value}, {widened, ws.handle()}, [=, &ctx](const Session::op_scope& op) {
        const auto bound = ws.bind(op, ctx);
        k::conv2d_forward(ctx, op.stream(), st.widen.shape, op.ptr<Elem>(sa.pooled), op.ptr<Elem>(st.widen.w.value),
                          op.ptr<Elem>(st.widen.b.value), op.ptr<Elem>(widened));
      }, flops(st.widen.shape));
      ws.release(s);
      x = widened;
    }
    for (std::size_t bi = 0; bi < st.blocks.size(); ++bi) {
      const res_block& blk = st.blocks[bi];
      const std::string bn = n + indexed("b", bi);
      block_acts ba;
      ba.x_in = x;
      const std::uint64_t bytes = out_bytes(blk.conv1.shape);
      ba.a1 = s.add_transient(bn + "conv1.out", bytes);
      const op_workspace ws1(s, bn + "conv1.forward.workspace", blk.conv1.workspace);
      s.recomputable_op(bn + "conv1.forward", {x, blk.conv1.w.value, blk.conv1.b.value}, {ba.a1, ws1.handle()}, [=, &ctx](const Session::op_scope& op) {
        const auto bound = ws1.bind(op, ctx);
        k::conv2d_forward(ctx, op.stream(), blk.conv1.shape, op.ptr<Elem>(x), op.ptr<Elem>(blk.conv1.w.value),
                          op.ptr<Elem>(blk.conv1.b.value), op.ptr<Elem>(ba.a1));
        k::relu_forward(ctx, op.stream(), op.ptr<Elem>(ba.a1), op.ptr<Elem>(ba.a1), bytes / et);
      }, flops(blk.conv1.shape));
      ws1.release(s);
      ba.y = s.add_transient(bn + "out", bytes);
      const op_workspace ws2(s, bn + "conv2.forward.workspace", blk.conv2.workspace);
      s.recomputable_op(bn + "conv2.forward", {ba.a1, blk.conv2.w.value, blk.conv2.b.value, x}, {ba.y, ws2.handle()}, [=, &ctx](const Session::op_scope& op) {
        const auto bound = ws2.bind(op, ctx);
        k::conv2d_forward(ctx, op.stream(), blk.conv2.shape, op.ptr<Elem>(ba.a1), op.ptr<Elem>(blk.conv2.w.value),
                          op.ptr<Elem>(blk.conv2.b.value), op.ptr<Elem>(ba.y));
        k::add(ctx, op.stream(), op.ptr<Elem>(ba.y), op.ptr<Elem>(x), op.ptr<Elem>(ba.y), bytes / et);
        k::relu_forward(ctx, op.stream(), op.ptr<Elem>(ba.y), op.ptr<Elem>(ba.y), bytes / et);
      }, flops(blk.conv2.shape));
      ws2.release(s);
      sa.blocks.push_back(ba);
      x = ba.y;
    }
  }
  const int C = final_channels_, Cl = sh_.classes;
  auto feat = s.add_transient("pool.features", static_cast<std::uint64_t>(B) * C * et);
  s.recomputable_op("gap.forward", {x}, {feat}, [=, this, &ctx](const Session::op_scope& op) {
    k::global_avg_pool_forward(ctx, op.stream(), op.ptr<Elem>(x), op.ptr<Elem>(feat), B, C, final_plane_);
  }, static_cast<double>(B) * C * final_plane_);
  auto logits = s.add_transient("fc.logits", static_cast<std::uint64_t>(B) * Cl * et);
  // A bf16 GEMM needs a workspace on the cpu backend (its operands widened); an fp32 one none.
  const std::size_t fc_ws_bytes = std::is_same_v<Elem, k::bf16> ? k::linear_bf16_workspace_bytes(ctx, B, C, Cl) : 0;
  const optional_workspace fc_ws(s, "fc.forward.workspace", fc_ws_bytes);
  s.recomputable_op("fc.forward", tensors({feat, fc_w_.value, fc_b_.value}), fc_ws.with({logits}), [=, this, &ctx](const Session::op_scope& op) {
    const auto bound = fc_ws.bind(op, ctx);
    k::linear_forward(ctx, op.stream(), op.ptr<Elem>(feat), op.ptr<Elem>(fc_w_.value), op.ptr<Elem>(fc_b_.value),
                      op.ptr<Elem>(logits), B, C, Cl);
  }, 2.0 * B * C * Cl);
  fc_ws.release(s);
  const tensor_handle loss = loss_.handle();
  const op_workspace loss_ws(s, "loss.workspace", k::softmax_cross_entropy_workspace_bytes(B));
  {
    auto op = s.op("loss.forward", {logits, labels}, {logits, loss, loss_ws.handle()}, 5.0 * B * Cl);
    const auto bound = loss_ws.bind(op, ctx);
    k::softmax_cross_entropy(ctx, op.stream(), op.ptr<Elem>(logits), op.ptr<std::int32_t>(labels), nullptr,
                             op.ptr<float>(loss), op.ptr<Elem>(logits), B, Cl, 1.0f / static_cast<float>(B));
  }
  loss_ws.release(s);
  s.release(labels);

  // ---- backward ----
  auto dfeat = s.add_transient("pool.dfeatures", static_cast<std::uint64_t>(B) * C * et);
  const optional_workspace fc_bwd_ws(s, "fc.backward.workspace", fc_ws_bytes);
  {
    auto op = s.op("fc.backward", tensors({feat, fc_w_.value, logits}), fc_bwd_ws.with({dfeat, fc_w_.grad, fc_b_.grad}),
                   4.0 * B * C * Cl);
    const auto bound = fc_bwd_ws.bind(op, ctx);
    k::linear_backward(ctx, op.stream(), op.ptr<Elem>(feat), op.ptr<Elem>(fc_w_.value), op.ptr<Elem>(logits),
                       op.ptr<Elem>(dfeat), op.ptr<Elem>(fc_w_.grad), op.ptr<Elem>(fc_b_.grad), B, C, Cl, false);
  }
  fc_bwd_ws.release(s);
  params_.gradient_ready(s, ctx, fc_w_);
  params_.gradient_ready(s, ctx, fc_b_);
  s.release(logits);
  s.release(feat);
  auto dres = s.add_transient("gap.dx", static_cast<std::uint64_t>(B) * C * final_plane_ * et);
  {
    auto op = s.op("gap.backward", {dfeat}, {dres}, static_cast<double>(B) * C * final_plane_);
    k::global_avg_pool_backward(ctx, op.stream(), op.ptr<Elem>(dfeat), op.ptr<Elem>(dres), B, C, final_plane_);
  }
  s.release(dfeat);
  for (std::size_t si = stages_.size(); si-- > 0;) {
    const stage& st = stages_[si];
    const stage_acts& sa = acts[si];
    const std::string n = indexed("s", si);
    for (std::size_t bi = st.blocks.size(); bi-- > 0;) {
      const res_block& blk = st.blocks[bi];
      const block_acts& ba = sa.blocks[bi];
      const std::string bn = n + indexed("b", bi);
      const std::uint64_t bytes = out_bytes(blk.conv1.shape);
      auto da1 = s.add_transient(bn + "conv1.dout", bytes);
      const op_workspace ws2(s, bn + "conv2.backward.workspace", blk.conv2.workspace);
      {
        // dres becomes d loss / d (conv2 output + skip) in place.
        auto op = s.op(bn + "conv2.backward", {ba.y, ba.a1, blk.conv2.w.value, dres},
                       {dres, da1, blk.conv2.w.grad, blk.conv2.b.grad, ws2.handle()}, 2 * flops(blk.conv2.shape));
        const auto bound = ws2.bind(op, ctx);
        k::relu_backward(ctx, op.stream(), op.ptr<Elem>(ba.y), op.ptr<Elem>(dres), op.ptr<Elem>(dres), bytes / et);
        k::conv2d_backward(ctx, op.stream(), blk.conv2.shape, op.ptr<Elem>(ba.a1), op.ptr<Elem>(blk.conv2.w.value),
                           op.ptr<Elem>(dres), op.ptr<Elem>(da1), op.ptr<Elem>(blk.conv2.w.grad),
                           op.ptr<Elem>(blk.conv2.b.grad), false);
      }
      ws2.release(s);
      params_.gradient_ready(s, ctx, blk.conv2.w);
      params_.gradient_ready(s, ctx, blk.conv2.b);
      s.release(ba.y);
      auto d_in = s.add_transient(bn + "din", bytes);
      const op_workspace ws1(s, bn + "conv1.backward.workspace", blk.conv1.workspace);
      {
        auto op = s.op(bn + "conv1.backward", {ba.a1, ba.x_in, blk.conv1.w.value, da1, dres},
                       {da1, d_in, blk.conv1.w.grad, blk.conv1.b.grad, ws1.handle()}, 2 * flops(blk.conv1.shape));
        const auto bound = ws1.bind(op, ctx);
        k::relu_backward(ctx, op.stream(), op.ptr<Elem>(ba.a1), op.ptr<Elem>(da1), op.ptr<Elem>(da1), bytes / et);
        k::conv2d_backward(ctx, op.stream(), blk.conv1.shape, op.ptr<Elem>(ba.x_in), op.ptr<Elem>(blk.conv1.w.value),
                           op.ptr<Elem>(da1), op.ptr<Elem>(d_in), op.ptr<Elem>(blk.conv1.w.grad),
                           op.ptr<Elem>(blk.conv1.b.grad), false);
        k::add(ctx, op.stream(), op.ptr<Elem>(d_in), op.ptr<Elem>(dres), op.ptr<Elem>(d_in), bytes / et);
      }
      ws1.release(s);
      params_.gradient_ready(s, ctx, blk.conv1.w);
      params_.gradient_ready(s, ctx, blk.conv1.b);
      for (auto t : {da1, ba.a1, dres}) s.release(t);
      dres = d_in;
    }
    // The first block's input is the stem's output or the widening convolution's.
    if (st.has_transition) {
      const tensor_handle widened = sa.blocks.front().x_in;
      s.release(widened);
      const std::uint64_t pooled_bytes = static_cast<std::uint64_t>(B) * st.pool.channels * st.pool.out_height() *
                                         st.pool.out_width() * et;
      auto dpooled = s.add_transient(n + "pool.dout", pooled_bytes);
      const op_workspace ws(s, n + "widen.backward.workspace", st.widen.workspace);
      {
        auto op = s.op(n + "widen.backward", {sa.pooled, st.widen.w.value, dres},
                       {dpooled, st.widen.w.grad, st.widen.b.grad, ws.handle()}, 2 * flops(st.widen.shape));
        const auto bound = ws.bind(op, ctx);
        k::conv2d_backward(ctx, op.stream(), st.widen.shape, op.ptr<Elem>(sa.pooled), op.ptr<Elem>(st.widen.w.value),
                           op.ptr<Elem>(dres), op.ptr<Elem>(dpooled), op.ptr<Elem>(st.widen.w.grad),
                           op.ptr<Elem>(st.widen.b.grad), false);
      }
      ws.release(s);
      params_.gradient_ready(s, ctx, st.widen.w);
      params_.gradient_ready(s, ctx, st.widen.b);
      s.release(dres);
      auto dx = s.add_transient(n + "pool.dx", static_cast<std::uint64_t>(B) * st.pool.channels * st.pool.height *
                                                   st.pool.width * et);
      {
        auto op = s.op(n + "pool.backward", {sa.x_in, sa.pooled, dpooled}, {dx}, static_cast<double>(pooled_bytes));
        k::max_pool2d_backward(ctx, op.stream(), st.pool, op.ptr<Elem>(sa.x_in), op.ptr<Elem>(sa.pooled),
                               op.ptr<Elem>(dpooled), op.ptr<Elem>(dx));
      }
      for (auto t : {dpooled, sa.pooled}) s.release(t);
      dres = dx;
    }
  }
  const op_workspace stem_bwd_ws(s, "stem.backward.workspace", stem_.workspace);
  {
    const std::uint64_t bytes = out_bytes(stem_.shape);
    auto op = s.op("stem.backward", {stem_out, images, stem_.w.value, dres},
                   {dres, stem_.w.grad, stem_.b.grad, stem_bwd_ws.handle()}, 2 * flops(stem_.shape));
    const auto bound = stem_bwd_ws.bind(op, ctx);
    k::relu_backward(ctx, op.stream(), op.ptr<Elem>(stem_out), op.ptr<Elem>(dres), op.ptr<Elem>(dres), bytes / et);
    k::conv2d_backward(ctx, op.stream(), stem_.shape, op.ptr<Elem>(images), op.ptr<Elem>(stem_.w.value),
                       op.ptr<Elem>(dres), nullptr, op.ptr<Elem>(stem_.w.grad), op.ptr<Elem>(stem_.b.grad), false);
  }
  stem_bwd_ws.release(s);
  params_.gradient_ready(s, ctx, stem_.w);
  params_.gradient_ready(s, ctx, stem_.b);
  for (auto t : {stem_out, images, dres}) s.release(t);
}

}  // namespace

std::unique_ptr<model> make_cnn(const cnn_shape& shape, std::uint64_t seed, precision p, const batch_shares& shares) {
  if (p == precision::bf16) return std::make_unique<cnn_model<k::bf16>>(shape, seed, shares);
  return std::make_unique<cnn_model<float>>(shape, seed, shares);
}

std::unique_ptr<model> make_cnn(const example_options& o) {
  cnn_shape shape = cnn_preset(o.size);
  shape.clip_grad_norm = static_cast<float>(o.clip_grad_norm);
  const batch_shares shares = batch_shares::from(o);
  shape.batch = shares.micro_batch(shape.batch);
  return make_cnn(shape, o.seed, o.prec, shares);
}

run_result run_cnn(const example_options& o, const step_observer& on_step) {
  return train(o, [&] { return make_cnn(o); }, on_step);
}

}  // namespace spillway::examples
