// The MLP example: a teacher (tanh hidden layer, argmax of its outputs) labels random inputs on
// the host; the student's layers, loss, backward and Adam run as Session ops.
#include "examples/mlp/mlp_model.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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

constexpr std::uint64_t f32 = sizeof(float);

class mlp_model final : public model {
 public:
  mlp_model(const mlp_shape& shape, std::uint64_t seed) : sh_(shape), seed_(seed) {
    if (sh_.depth < 1 || sh_.width <= 0 || sh_.classes <= 1)
      throw config_error("mlp shape: depth " + std::to_string(sh_.depth) + ", width " + std::to_string(sh_.width) +
                         ", classes " + std::to_string(sh_.classes) + "; needs depth >= 1, width >= 1, classes >= 2");
    rng r(seed_, 10);
    teacher_w1_ = normal_values(r, static_cast<std::size_t>(sh_.teacher_hidden) * sh_.inputs, 1.0 / std::sqrt(sh_.inputs));
    teacher_w2_ = normal_values(r, static_cast<std::size_t>(sh_.classes) * sh_.teacher_hidden,
                                1.0 / std::sqrt(sh_.teacher_hidden));
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
  [[nodiscard]] std::string describe() const override {
    return "mlp: " + std::to_string(sh_.depth) + " hidden layers of " + std::to_string(sh_.width) + ", " +
           std::to_string(sh_.inputs) + " inputs, " + std::to_string(sh_.classes) + " teacher classes, batch " +
           std::to_string(sh_.batch);
  }

 private:
  void make_batch(std::int64_t step);

  mlp_shape sh_;
  std::uint64_t seed_;
  std::vector<float> teacher_w1_, teacher_w2_;
  std::unique_ptr<k::kernel_context> ctx_;
  parameter_set params_;
  loss_value loss_;
  std::vector<parameter> weights_, biases_;
  parameter head_w_, head_b_;
  std::vector<float> inputs_;
  std::vector<std::int32_t> labels_;
  pinned_staging staging_;
};

void mlp_model::make_batch(std::int64_t step) {
  const std::size_t B = static_cast<std::size_t>(sh_.batch), I = static_cast<std::size_t>(sh_.inputs);
  const std::size_t Hd = static_cast<std::size_t>(sh_.teacher_hidden), Cl = static_cast<std::size_t>(sh_.classes);
  rng r(seed_, 12, static_cast<std::uint64_t>(step));
  inputs_ = normal_values(r, B * I, 1.0);
  labels_.assign(B, 0);
  std::vector<double> h(Hd);
  for (std::size_t b = 0; b < B; ++b) {
    const float* x = inputs_.data() + b * I;
    for (std::size_t j = 0; j < Hd; ++j) {
      double acc = 0;
      for (std::size_t i = 0; i < I; ++i) acc += static_cast<double>(teacher_w1_[j * I + i]) * x[i];
      h[j] = std::tanh(acc);
    }
    double best = -1e300;
    for (std::size_t c = 0; c < Cl; ++c) {
      double acc = 0;
      for (std::size_t j = 0; j < Hd; ++j) acc += static_cast<double>(teacher_w2_[c * Hd + j]) * h[j];
      if (acc > best) {
        best = acc;
        labels_[b] = static_cast<std::int32_t>(c);
      }
    }
  }
}

float mlp_model::train_step(Session& s, std::int64_t step) {
  const int B = sh_.batch, W = sh_.width, D = sh_.depth, Cl = sh_.classes;
  const std::uint64_t b = static_cast<std::uint64_t>(B);
  const std::uint64_t hidden = b * static_cast<std::uint64_t>(W) * f32;
  const double db = B, dw = W;
  k::kernel_context& ctx = *ctx_;

  make_batch(step);
  auto x = s.add_transient("inputs", b * static_cast<std::uint64_t>(sh_.inputs) * f32);
  auto labels = s.add_transient("labels", b * sizeof(std::int32_t));
  {
    auto op = s.op("batch.upload", {}, {x, labels});
    staging_.upload(op.device(), op.stream(),
                    {{op.ptr(x), inputs_.data(), inputs_.size() * f32},
                     {op.ptr(labels), labels_.data(), labels_.size() * sizeof(std::int32_t)}});
  }

  // Forward: h[i] = relu(W_i h[i-1] + b_i), h[-1] = inputs. The ReLU runs in place, and its
  // backward reads the output (positive exactly where the input was).
  std::vector<tensor_handle> h;
  int fan_in = sh_.inputs;
  for (int i = 0; i < D; ++i) {
    const tensor_handle prev = i == 0 ? x : h.back();
    auto out = s.add_transient(indexed("l", i) + "out", hidden);
    const parameter& w = weights_[static_cast<std::size_t>(i)];
    const parameter& bias = biases_[static_cast<std::size_t>(i)];
    {
      auto op = s.op(indexed("l", i) + "forward", {prev, w.value, bias.value}, {out}, 2 * db * dw * fan_in);
      k::linear_forward(ctx, op.stream(), op.ptr<float>(prev), op.ptr<float>(w.value), op.ptr<float>(bias.value),
                        op.ptr<float>(out), B, fan_in, W);
      k::relu_forward(ctx, op.stream(), op.ptr<float>(out), op.ptr<float>(out), b * static_cast<std::uint64_t>(W));
    }
    h.push_back(out);
    fan_in = W;
  }
  auto logits = s.add_transient("head.logits", b * static_cast<std::uint64_t>(Cl) * f32);
  {
    auto op = s.op("head.forward", {h.back(), head_w_.value, head_b_.value}, {logits}, 2 * db * dw * Cl);
    k::linear_forward(ctx, op.stream(), op.ptr<float>(h.back()), op.ptr<float>(head_w_.value),
                      op.ptr<float>(head_b_.value), op.ptr<float>(logits), B, W, Cl);
  }
  const tensor_handle loss = loss_.handle();
  const op_workspace loss_ws(s, "loss.workspace", k::softmax_cross_entropy_workspace_bytes(B));
  {
    auto op = s.op("loss.forward", {logits, labels}, {logits, loss, loss_ws.handle()}, 5 * db * Cl);
    const auto bound = loss_ws.bind(op, ctx);
    k::softmax_cross_entropy(ctx, op.stream(), op.ptr<float>(logits), op.ptr<std::int32_t>(labels), nullptr,
                             op.ptr<float>(loss), op.ptr<float>(logits), B, Cl, 1.0f / static_cast<float>(B));
  }
  loss_ws.release(s);
  s.release(labels);

  // Backward.
  auto dh = s.add_transient(indexed("l", D - 1) + "dout", hidden);
  {
    auto op = s.op("head.backward", {h.back(), head_w_.value, logits}, {dh, head_w_.grad, head_b_.grad}, 4 * db * dw * Cl);
    k::linear_backward(ctx, op.stream(), op.ptr<float>(h.back()), op.ptr<float>(head_w_.value), op.ptr<float>(logits),
                       op.ptr<float>(dh), op.ptr<float>(head_w_.grad), op.ptr<float>(head_b_.grad), B, W, Cl, false);
  }
  s.release(logits);
  for (int i = D - 1; i >= 0; --i) {
    const parameter& w = weights_[static_cast<std::size_t>(i)];
    const parameter& bias = biases_[static_cast<std::size_t>(i)];
    const tensor_handle out = h[static_cast<std::size_t>(i)];
    const std::string n = indexed("l", i);
    const int in = i == 0 ? sh_.inputs : W;
    if (i > 0) {
      const tensor_handle prev = h[static_cast<std::size_t>(i - 1)];
      auto dprev = s.add_transient(indexed("l", i - 1) + "dout", hidden);
      {
        auto op = s.op(n + "backward", {out, prev, w.value, dh}, {dh, dprev, w.grad, bias.grad}, 4 * db * dw * in);
        k::relu_backward(ctx, op.stream(), op.ptr<float>(out), op.ptr<float>(dh), op.ptr<float>(dh),
                         b * static_cast<std::uint64_t>(W));
        k::linear_backward(ctx, op.stream(), op.ptr<float>(prev), op.ptr<float>(w.value), op.ptr<float>(dh),
                           op.ptr<float>(dprev), op.ptr<float>(w.grad), op.ptr<float>(bias.grad), B, in, W, false);
      }
      s.release(dh);
      s.release(out);
      dh = dprev;
    } else {
      {
        auto op = s.op(n + "backward", {out, x, w.value, dh}, {dh, w.grad, bias.grad}, 2 * db * dw * in);
        k::relu_backward(ctx, op.stream(), op.ptr<float>(out), op.ptr<float>(dh), op.ptr<float>(dh),
                         b * static_cast<std::uint64_t>(W));
        k::linear_backward(ctx, op.stream(), op.ptr<float>(x), op.ptr<float>(w.value), op.ptr<float>(dh), nullptr,
                           op.ptr<float>(w.grad), op.ptr<float>(bias.grad), B, in, W, false);
      }
      s.release(dh);
      s.release(out);
    }
  }
  s.release(x);

  params_.clip_grad_norm(s, ctx, sh_.clip_grad_norm);
  params_.adam_step(s, ctx, k::adam_config{sh_.lr, 0.9f, 0.999f, 1e-8f, 0.0f}, step + 1);

  return loss_.read(s);
}

}  // namespace

std::unique_ptr<model> make_mlp(const mlp_shape& shape, std::uint64_t seed) {
  return std::make_unique<mlp_model>(shape, seed);
}

std::unique_ptr<model> make_mlp(const example_options& o) {
  mlp_shape shape = mlp_preset(o.size);
  shape.clip_grad_norm = static_cast<float>(o.clip_grad_norm);
  return make_mlp(shape, o.seed);
}

run_result run_mlp(const example_options& o, const step_observer& on_step) {
  return train(o, [&] { return make_mlp(o); }, on_step);
}

}  // namespace spillway::examples
