// Zoo: convolutional traces (VGG-16, ResNet-50, ResNet-152) from their published layer
// tables, fp32, NCHW. Each conv gets a cuDNN-style workspace (twice its output, capped at
// 64 MiB); batch norm keeps its input for backward, ReLU its output; a residual add hands its
// gradient to both branches (Note [Adds pass their gradient on] in zoo_builder.cpp).
#include <algorithm>
#include <string>

#include "device/error.hpp"
#include "offload/zoo_builder.hpp"
#include "offload/zoo_detail.hpp"

namespace spillway::offload::detail {

namespace {

struct fmap {
  tensor_id t;
  std::uint64_t c, h, w;
};

class cnn {
 public:
  cnn(std::uint32_t batch, const precision_setup& p) : m_(p.act_bytes, p.mixed, p.clip), n_(batch) {}
  model_builder& builder() { return m_; }
  std::int32_t next_layer() { return ++layer_; }
  std::int32_t layer() const { return layer_; }

  fmap conv(const std::string& name, const fmap& x, std::uint64_t cout, std::uint64_t k, std::uint64_t stride,
            bool bias) {
    const std::uint64_t pad = k / 2;
    const std::uint64_t ho = (x.h + 2 * pad - k) / stride + 1, wo = (x.w + 2 * pad - k) / stride + 1;
    const auto w = m_.param(name + ".w", x.c * cout * k * k + (bias ? cout : 0), layer_);
    const auto out = m_.act(name + ".out", n_ * cout * ho * wo);
    const double fl = 2.0 * n_ * ho * wo * cout * x.c * k * k;
    const std::uint64_t ws = std::min<std::uint64_t>(64ull << 20, 2 * n_ * cout * ho * wo * 4);
    m_.fwd({name, "conv", layer_, {x.t}, {w}, {out}, {x.t}, fl, 2 * fl, ws});
    return {out, cout, ho, wo};
  }
  fmap bn(const std::string& name, const fmap& x) {
    const auto w = m_.param(name + ".w", 2 * x.c, layer_);
    const auto out = m_.act(name + ".out", elems(x));
    const double e = static_cast<double>(elems(x));
    m_.fwd({name, "norm", layer_, {x.t}, {w}, {out}, {x.t}, 8 * e, 16 * e, 0});
    return {out, x.c, x.h, x.w};
  }
  fmap relu(const std::string& name, const fmap& x) {
    const auto out = m_.act(name + ".out", elems(x));
    const double e = static_cast<double>(elems(x));
    m_.fwd({name, "elementwise", layer_, {x.t}, {}, {out}, {out}, e, 2 * e, 0});
    return {out, x.c, x.h, x.w};
  }
  fmap add(const std::string& name, const fmap& a, const fmap& b) {
    const auto out = m_.act(name + ".out", elems(a));
    const double e = static_cast<double>(elems(a));
    m_.fwd({name, "elementwise", layer_, {a.t, b.t}, {}, {out}, {}, e, 2 * e, 0, true});
    return {out, a.c, a.h, a.w};
  }
  fmap pool(const std::string& name, const fmap& x, std::uint64_t k, std::uint64_t stride, bool global) {
    if (!global && (x.h < k || x.w < k))  // make_model_trace checks the image side first
      throw config_error("zoo: '" + name + "' gets a " + std::to_string(x.h) + "x" + std::to_string(x.w) +
                         " map, smaller than its " + std::to_string(k) + "x" + std::to_string(k) +
                         " window; give a larger image side");
    const std::uint64_t ho = global ? 1 : (x.h - k) / stride + 1, wo = global ? 1 : (x.w - k) / stride + 1;
    const auto out = m_.act(name + ".out", n_ * x.c * ho * wo);
    const double e = static_cast<double>(elems(x));
    m_.fwd({name, "pool", layer_, {x.t}, {}, {out}, {x.t}, e, 2 * e, 0});
    return {out, x.c, ho, wo};
  }
  fmap fc(const std::string& name, const fmap& x, std::uint64_t out_features) {
    const std::uint64_t in = x.c * x.h * x.w;
    const auto w = m_.param(name + ".w", in * out_features + out_features, layer_);
    const auto out = m_.act(name + ".out", n_ * out_features);
    const double fl = 2.0 * n_ * in * out_features;
    m_.fwd({name, "matmul", layer_, {x.t}, {w}, {out}, {x.t}, fl, 2 * fl, 0});
    return {out, out_features, 1, 1};
  }
  std::uint64_t elems(const fmap& x) const { return n_ * x.c * x.h * x.w; }

 private:
  model_builder m_;
  std::uint64_t n_;
  std::int32_t layer_ = 0;
};

trace vgg16(std::uint32_t batch, std::uint32_t image, const precision_setup& prec) {
  cnn c(batch, prec);
  auto& m = c.builder();
  fmap x{m.input("images", static_cast<std::uint64_t>(batch) * 3 * image * image), 3, image, image};
  const auto labels = m.input("labels", batch, 4);
  const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  int i = 0;
  for (int v : cfg) {
    const std::string p = "features." + std::to_string(i++);
    c.next_layer();
    if (v == 0) {
      x = c.pool(p + ".pool", x, 2, 2, false);
    } else {
      x = c.conv(p + ".conv", x, static_cast<std::uint64_t>(v), 3, 1, true);
      x = c.relu(p + ".relu", x);
    }
  }
  c.next_layer();
  x = c.relu("fc6.relu", c.fc("fc6", x, 4096));
  c.next_layer();
  x = c.relu("fc7.relu", c.fc("fc7", x, 4096));
  c.next_layer();
  x = c.fc("fc8", x, 1000);
  m.loss("loss", x.t, labels, c.layer());
  return m.finish();
}

trace resnet(std::uint32_t batch, std::uint32_t image, const int (&blocks)[4], const precision_setup& prec) {
  cnn c(batch, prec);
  auto& m = c.builder();
  fmap x{m.input("images", static_cast<std::uint64_t>(batch) * 3 * image * image), 3, image, image};
  const auto labels = m.input("labels", batch, 4);
  c.next_layer();
  x = c.relu("stem.relu", c.bn("stem.bn", c.conv("stem.conv", x, 64, 7, 2, false)));
  x = c.pool("stem.pool", x, 3, 2, false);
  const std::uint64_t widths[] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s) {
    for (int b = 0; b < blocks[s]; ++b) {
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(b) + ".";
      const std::uint64_t w = widths[s], stride = (b == 0 && s > 0) ? 2 : 1;
      c.next_layer();
      fmap y = c.relu(p + "relu1", c.bn(p + "bn1", c.conv(p + "conv1", x, w, 1, 1, false)));
      y = c.relu(p + "relu2", c.bn(p + "bn2", c.conv(p + "conv2", y, w, 3, stride, false)));
      y = c.bn(p + "bn3", c.conv(p + "conv3", y, 4 * w, 1, 1, false));
      fmap shortcut = x;
      if (b == 0) shortcut = c.bn(p + "down.bn", c.conv(p + "down.conv", x, 4 * w, 1, stride, false));
      x = c.relu(p + "relu3", c.add(p + "add", y, shortcut));
    }
  }
  c.next_layer();
  x = c.pool("avgpool", x, 0, 1, true);
  x = c.fc("fc", x, 1000);
  m.loss("loss", x.t, labels, c.layer());
  return m.finish();
}

}  // namespace

trace make_cnn(cnn_kind kind, std::uint32_t batch, std::uint32_t image, const precision_setup& prec) {
  static constexpr int r50[4] = {3, 4, 6, 3};
  static constexpr int r152[4] = {3, 8, 36, 3};
  switch (kind) {
    case cnn_kind::vgg16:
      return vgg16(batch, image, prec);
    case cnn_kind::resnet50:
      return resnet(batch, image, r50, prec);
    case cnn_kind::resnet152:
      return resnet(batch, image, r152, prec);
  }
  return {};
}

}  // namespace spillway::offload::detail
