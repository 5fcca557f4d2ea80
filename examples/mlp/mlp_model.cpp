// The MLP example: a teacher (tanh hidden layer, argmax of its outputs) labels random inputs on
// the host; the student's layers, loss, backward and Adam run as Session ops.
#include "examples/mlp/mlp_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <cblas.h>

#include "device/error.hpp"
#include "examples/common/device_io.hpp"
#include "examples/common/loss_value.hpp"
#include "examples/common/names.hpp"
#include "examples/common/parameters.hpp"
#include "examples/common/random.hpp"
#include "kernels/kernels.hpp"

namespace spillway::examples {

namespace k = spillway::kernels;

mlp_shape mlp_preset(preset p) {
  switch (p) {
    case preset::tiny: return {16, 32, 8, 8, 64, 16, 3e-3f};
    case preset::small: return {512, 2048, 8, 16, 256, 64, 3e-4f};
    case preset::medium: return {1024, 4096, 16, 32, 512, 64, 1e-4f};
    case preset::large: return {2048, 8192, 24, 64, 1024, 128, 1e-4f};
  }
  return {};
}

namespace {

// Elem: the storage type of weights, activations and gradients (float, or kernels::bf16 in
// mixed precision; Note [Mixed precision] in examples/common/precision.hpp).
template <class Elem>
class mlp_model final : public model {
 public:
  mlp_model(const mlp_shape& shape, std::uint64_t seed, const batch_shares& shares)
      : sh_(shape), seed_(seed), params_(std::is_same_v<Elem, k::bf16> ? precision::bf16 : precision::fp32, shares) {
    if (sh_.depth < 1 || sh_.width <= 0 || sh_.classes <= 1)
      throw config_error("mlp shape: depth " + std::to_string(sh_.depth) + ", width " + std::to_string(sh_.width) +
                         ", classes " + std::to_string(sh_.classes) + "; needs depth >= 1, width >= 1, classes >= 2");
    rng r(seed_, 10);
    const auto w1 = normal_values(r, static_cast<std::size_t>(sh_.teacher_hidden) * sh_.inputs, 1.0 / std::sqrt(sh_.inputs));
    const auto w2 = normal_values(r, static_cast<std::size_t>(sh_.classes) * sh_.teacher_hidden,
                                  1.0 / std::sqrt(sh_.teacher_hidden));
    teacher_w1_.assign(w1.begin(), w1.end());
    teacher_w2_.assign(w2.begin(), w2.end());
  }

  void build(Session& s) override {
    ctx_ = std::make_unique<k::kernel_context>(s.device());
    rng r(seed_, 11);
    int fan_in = sh_.inputs;
    for (int i = 0; i < sh_.depth; ++i) {
      const std::string n = indexed("l", i);
      const std::size_t w = static_cast<std::size_t>(sh_.width);
      weights_.push_back(params_.add(s, n + "weight", normal_values(r, w * static_cast<std::size_t>(fan_in),
                                                                      std::sqrt(2.0 / fan_in))));
      biases_.push_back(params_.add(s, n + "bias", std::vector<float>(w, 0.0f)));
      fan_in = sh_.width;
    }
    head_w_ = params_.add(s, "head.weight",
                          normal_values(r, static_cast<std::size_t>(sh_.classes) * sh_.width, 1.0 / std::sqrt(sh_.width)));
    head_b_ = params_.add(s, "head.bias", std::vector<float>(static_cast<std::size_t>(sh_.classes), 0.0f));
    loss_.add(s);
  }

  float train_step(Session& s, std::int64_t step) override;

  [[nodiscard]] std::uint64_t parameter_count() const override { return params_.count(); }
  [[nodiscard]] gradient_exchange::stats exchange_stats() const override { return params_.exchange_stats(); }
  [[nodiscard]] const batch_shares* shares() const override { return &params_.shares(); }
  [[nodiscard]] std::string describe() const override {
    return "mlp: " + std::to_string(sh_.depth) + " hidden layers of " + std::to_string(sh_.width) + ", " +
           std::to_string(sh_.inputs) + " inputs, " + std::to_string(sh_.classes) + " teacher classes, batch " +
           std::to_string(sh_.batch) + ", " + to_string(params_.format());
  }

 private:
  void make_batch(std::int64_t step, int micro_batch);
  void pass(Session& s, std::int64_t step, int micro_batch);

  mlp_shape sh_;
  std::uint64_t seed_;
  std::vector<double> teacher_w1_, teacher_w2_;  // the teacher's weights, for make_batch's GEMMs
  std::unique_ptr<k::kernel_context> ctx_;
  parameter_set params_;
  loss_value loss_;
  std::vector<parameter> weights_, biases_;
  parameter head_w_, head_b_;
  std::vector<float> inputs_;
  std::vector<Elem> inputs_stored_;  // inputs_ in the storage type, read by the upload op
  std::vector<std::int32_t> labels_;
  pinned_staging staging_;
};

template <class Elem>
void mlp_model<Elem>::make_batch(std::int64_t step, int micro_batch) {
  // The step's whole batch, of which this micro-batch keeps its share (Note [Micro-batches]).
  const auto shares = static_cast<std::size_t>(params_.shares().count);
  const std::size_t B = static_cast<std::size_t>(sh_.batch) * shares, I = static_cast<std::size_t>(sh_.inputs);
  const std::size_t Hd = static_cast<std::size_t>(sh_.teacher_hidden), Cl = static_cast<std::size_t>(sh_.classes);
  // The inputs (normal_values draws them in blocks at once, the bits of one generator), then the
  // teacher in double precision: hidden = tanh(inputs x W1^T), scores = hidden x W2^T, the label
  // the largest score, as two OpenBLAS GEMMs. On one thread, with plain loops, a batch of the
  // medium preset took about 31 ms on two cores here (now 8), most of the host time between the
  // student's steps that the GPU check's timelines showed on its H200.
  rng r(seed_, 12, static_cast<std::uint64_t>(step));
  inputs_ = normal_values(r, B * I, 1.0);
  const std::vector<double> x(inputs_.begin(), inputs_.end());
  std::vector<double> hidden(B * Hd), scores(B * Cl);
  const auto bi = static_cast<blasint>(B), ii = static_cast<blasint>(I), hi = static_cast<blasint>(Hd),
             ci = static_cast<blasint>(Cl);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi, hi, ii, 1.0, x.data(), ii, teacher_w1_.data(), ii, 0.0,
              hidden.data(), hi);
  for (double& v : hidden) v = std::tanh(v);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi, ci, hi, 1.0, hidden.data(), hi, teacher_w2_.data(), hi, 0.0,
              scores.data(), ci);
  labels_.assign(B, 0);
  for (std::size_t b = 0; b < B; ++b) {
    const double* row = scores.data() + b * Cl;
    labels_[b] = static_cast<std::int32_t>(std::max_element(row, row + Cl) - row);
  }
  if (shares == 1) return;
  const std::size_t mb = static_cast<std::size_t>(micro_batch), b = static_cast<std::size_t>(sh_.batch);
  inputs_ = std::vector<float>(inputs_.begin() + static_cast<std::ptrdiff_t>(mb * b * I),
                               inputs_.begin() + static_cast<std::ptrdiff_t>((mb + 1) * b * I));
  labels_ = std::vector<std::int32_t>(labels_.begin() + static_cast<std::ptrdiff_t>(mb * b),
                                      labels_.begin() + static_cast<std::ptrdiff_t>((mb + 1) * b));
}

template <class Elem>
float mlp_model<Elem>::train_step(Session& s, std::int64_t step) {
  return params_.train_step(
      s, *ctx_, step + 1, [&](int mb) { pass(s, step, mb); }, [&] { return loss_.read(s); },
      k::adam_config{sh_.lr, 0.9f, 0.999f, 1e-8f, 0.0f}, sh_.clip_grad_norm);
}

template <class Elem>
void mlp_model<Elem>::pass(Session& s, std::int64_t step, int micro_batch) {
  const int B = sh_.batch, W = sh_.width, D = sh_.depth, Cl = sh_.classes;
  const std::uint64_t b = static_cast<std::uint64_t>(B);
  constexpr std::uint64_t et = sizeof(Elem);  // bytes of a weight, activation or gradient element
  const std::uint64_t hidden = b * static_cast<std::uint64_t>(W) * et;
  const double db = B, dw = W;
  k::kernel_context& ctx = *ctx_;

  make_batch(step, micro_batch);
  inputs_stored_.resize(inputs_.size());
  for (std::size_t i = 0; i < inputs_.size(); ++i) inputs_stored_[i] = k::store_as<Elem>(inputs_[i]);
  auto x = s.add_transient("inputs", b * static_cast<std::uint64_t>(sh_.inputs) * et);
  auto labels = s.add_transient("labels", b * sizeof(std::int32_t));
  {
    auto op = s.op("batch.upload", {}, {x, labels});
    staging_.upload(op.device(), op.stream(),
                    {{op.ptr(x), inputs_stored_.data(), inputs_stored_.size() * et},
                     {op.ptr(labels), labels_.data(), labels_.size() * sizeof(std::int32_t)}});
  }

  // bf16 GEMMs need a workspace on the cpu backend (their operands widened to fp32); fp32 ones
  // need none, so in fp32 this is 0 and the ops keep their tensor lists.
  const auto linear_ws = [&](int in, int out) -> std::size_t {
    return std::is_same_v<Elem, k::bf16> ? k::linear_bf16_workspace_bytes(ctx, B, in, out) : 0;
  };

  // Forward: h[i] = relu(W_i h[i-1] + b_i), h[-1] = inputs. The ReLU runs in place, and its
  // backward reads the output (positive exactly where the input was).
  std::vector<tensor_handle> h;
  int fan_in = sh_.inputs;
  for (int i = 0; i < D; ++i) {
    const tensor_handle prev = i == 0 ? x : h.back();
    auto out = s.add_transient(indexed("l", i) + "out", hidden);
    const parameter& w = weights_[static_cast<std::size_t>(i)];
    const parameter& bias = biases_[static_cast<std::size_t>(i)];
    const optional_workspace ws(s, indexed("l", i) + "forward.workspace", linear_ws(fan_in, W));
    {
      auto op = s.op(indexed("l", i) + "forward", tensors({prev, w.value, bias.value}), ws.with({out}), 2 * db * dw * fan_in);
      const auto bound = ws.bind(op, ctx);
      k::linear_forward(ctx, op.stream(), op.ptr<Elem>(prev), op.ptr<Elem>(w.value), op.ptr<Elem>(bias.value),
                        op.ptr<Elem>(out), B, fan_in, W);
      k::relu_forward(ctx, op.stream(), op.ptr<Elem>(out), op.ptr<Elem>(out), b * static_cast<std::uint64_t>(W));
    }
    ws.release(s);
    h.push_back(out);
    fan_in = W;
  }
  auto logits = s.add_transient("head.logits", b * static_cast<std::uint64_t>(Cl) * et);
  const optional_workspace head_ws(s, "head.forward.workspace", linear_ws(W, Cl));
  {
    auto op = s.op("head.forward", tensors({h.back(), head_w_.value, head_b_.value}), head_ws.with({logits}), 2 * db * dw * Cl);
    const auto bound = head_ws.bind(op, ctx);
    k::linear_forward(ctx, op.stream(), op.ptr<Elem>(h.back()), op.ptr<Elem>(head_w_.value),
                      op.ptr<Elem>(head_b_.value), op.ptr<Elem>(logits), B, W, Cl);
  }
  head_ws.release(s);
  const tensor_handle loss = loss_.handle();
  const op_workspace loss_ws(s, "loss.workspace", k::softmax_cross_entropy_workspace_bytes(B));
  {
    auto op = s.op("loss.forward", {logits, labels}, {logits, loss, loss_ws.handle()}, 5 * db * Cl);
    const auto bound = loss_ws.bind(op, ctx);
    k::softmax_cross_entropy(ctx, op.stream(), op.ptr<Elem>(logits), op.ptr<std::int32_t>(labels), nullptr,
                             op.ptr<float>(loss), op.ptr<Elem>(logits), B, Cl, 1.0f / static_cast<float>(B));
  }
  loss_ws.release(s);
  s.release(labels);

  // Backward.
  auto dh = s.add_transient(indexed("l", D - 1) + "dout", hidden);
  const optional_workspace head_bwd_ws(s, "head.backward.workspace", linear_ws(W, Cl));
  {
    auto op = s.op("head.backward", tensors({h.back(), head_w_.value, logits}),
                   head_bwd_ws.with({dh, head_w_.grad, head_b_.grad}), 4 * db * dw * Cl);
    const auto bound = head_bwd_ws.bind(op, ctx);
    k::linear_backward(ctx, op.stream(), op.ptr<Elem>(h.back()), op.ptr<Elem>(head_w_.value), op.ptr<Elem>(logits),
                       op.ptr<Elem>(dh), op.ptr<Elem>(head_w_.grad), op.ptr<Elem>(head_b_.grad), B, W, Cl, false);
  }
  head_bwd_ws.release(s);
  params_.gradient_ready(s, ctx, head_w_);
  params_.gradient_ready(s, ctx, head_b_);
  s.release(logits);
  for (int i = D - 1; i >= 0; --i) {
    const parameter& w = weights_[static_cast<std::size_t>(i)];
    const parameter& bias = biases_[static_cast<std::size_t>(i)];
    const tensor_handle out = h[static_cast<std::size_t>(i)];
    const std::string n = indexed("l", i);
    const int in = i == 0 ? sh_.inputs : W;
    const optional_workspace ws(s, n + "backward.workspace", linear_ws(in, W));
    if (i > 0) {
      const tensor_handle prev = h[static_cast<std::size_t>(i - 1)];
      auto dprev = s.add_transient(indexed("l", i - 1) + "dout", hidden);
      {
        auto op = s.op(n + "backward", tensors({out, prev, w.value, dh}), ws.with({dh, dprev, w.grad, bias.grad}),
                       4 * db * dw * in);
        const auto bound = ws.bind(op, ctx);
        k::relu_backward(ctx, op.stream(), op.ptr<Elem>(out), op.ptr<Elem>(dh), op.ptr<Elem>(dh),
                         b * static_cast<std::uint64_t>(W));
        k::linear_backward(ctx, op.stream(), op.ptr<Elem>(prev), op.ptr<Elem>(w.value), op.ptr<Elem>(dh),
                           op.ptr<Elem>(dprev), op.ptr<Elem>(w.grad), op.ptr<Elem>(bias.grad), B, in, W, false);
      }
      ws.release(s);
      params_.gradient_ready(s, ctx, w);
      params_.gradient_ready(s, ctx, bias);
      s.release(dh);
      s.release(out);
      dh = dprev;
    } else {
      {
        auto op = s.op(n + "backward", tensors({out, x, w.value, dh}), ws.with({dh, w.grad, bias.grad}), 2 * db * dw * in);
        const auto bound = ws.bind(op, ctx);
        k::relu_backward(ctx, op.stream(), op.ptr<Elem>(out), op.ptr<Elem>(dh), op.ptr<Elem>(dh),
                         b * static_cast<std::uint64_t>(W));
        k::linear_backward(ctx, op.stream(), op.ptr<Elem>(x), op.ptr<Elem>(w.value), op.ptr<Elem>(dh), nullptr,
                           op.ptr<Elem>(w.grad), op.ptr<Elem>(bias.grad), B, in, W, false);
      }
      ws.release(s);
      params_.gradient_ready(s, ctx, w);
      params_.gradient_ready(s, ctx, bias);
      s.release(dh);
      s.release(out);
    }
  }
  s.release(x);
}

}  // namespace

std::unique_ptr<model> make_mlp(const mlp_shape& shape, std::uint64_t seed, precision p, const batch_shares& shares) {
  if (p == precision::bf16) return std::make_unique<mlp_model<k::bf16>>(shape, seed, shares);
  return std::make_unique<mlp_model<float>>(shape, seed, shares);
}

std::unique_ptr<model> make_mlp(const example_options& o) {
  mlp_shape shape = mlp_preset(o.size);
  shape.clip_grad_norm = static_cast<float>(o.clip_grad_norm);
  const batch_shares shares = batch_shares::from(o);
  shape.batch = shares.micro_batch(shape.batch);
  return make_mlp(shape, o.seed, o.prec, shares);
}

run_result run_mlp(const example_options& o, const step_observer& on_step) {
  return train(o, [&] { return make_mlp(o); }, on_step);
}

}  // namespace spillway::examples
