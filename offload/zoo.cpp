// Zoo: the list of models, their default batch and sequence length, and the dispatch to
// the family generators (shapes from the GPT-2, GPT-3, BERT, VGG and ResNet papers).
#include "offload/zoo.hpp"

#include <algorithm>
#include <cmath>

#include "device/error.hpp"
#include "offload/zoo_detail.hpp"

namespace spillway::offload {

namespace {
struct transformer_entry {
  const char* name;
  detail::transformer_shape shape;
  std::uint32_t batch, seq;
};
// layers, hidden, heads, vocab, MLM head; default batch and sequence length.
constexpr transformer_entry transformers[] = {
    {"gpt2-small", {12, 768, 12, 50257, false}, 8, 1024},
    {"gpt2-medium", {24, 1024, 16, 50257, false}, 8, 1024},
    {"gpt2-large", {36, 1280, 20, 50257, false}, 8, 1024},
    {"gpt2-xl", {48, 1600, 25, 50257, false}, 8, 1024},
    {"gpt3-6.7b", {32, 4096, 32, 50257, false}, 4, 2048},
    {"gpt3-13b", {40, 5140, 40, 50257, false}, 4, 2048},
    {"bert-large", {24, 1024, 16, 30522, true}, 32, 512},
};
}  // namespace

std::vector<std::string> zoo_model_names() {
  std::vector<std::string> names;
  for (const auto& e : transformers) names.emplace_back(e.name);
  for (const char* n : {"vgg16", "resnet50", "resnet152"}) names.emplace_back(n);
  return names;
}

zoo_precision parse_zoo_precision(std::string_view s, std::string_view where) {
  if (s == "default") return zoo_precision::model_default;
  if (s == "fp32") return zoo_precision::fp32;
  if (s == "bf16") return zoo_precision::bf16;
  if (s == "fp16") return zoo_precision::fp16;
  throw config_error(std::string(where) + ": '" + std::string(s) + "' is not a precision (default, fp32, bf16, fp16)");
}

namespace {
detail::precision_setup setup_for(zoo_precision p, bool transformer, bool clip) {
  if (p == zoo_precision::model_default) p = transformer ? zoo_precision::bf16 : zoo_precision::fp32;
  return p == zoo_precision::fp32 ? detail::precision_setup{4, false, clip} : detail::precision_setup{2, true, clip};
}

// A generated tensor must stay below what a trace describes: elements of the largest ones.
void check_shape(std::string_view name, const detail::transformer_shape& s, std::uint32_t batch, std::uint32_t seq) {
  const double T = static_cast<double>(batch) * seq;
  const double biggest = std::max({T * 4.0 * s.hidden, static_cast<double>(batch) * s.heads * seq * seq,
                                   T * static_cast<double>(s.vocab), 12.0 * s.hidden * static_cast<double>(s.hidden)});
  if (biggest * 4 > 1e15)
    throw config_error("model '" + std::string(name) + "': batch " + std::to_string(batch) + ", sequence " +
                       std::to_string(seq) + ", hidden " + std::to_string(s.hidden) +
                       " make tensors past a petabyte; give smaller shapes");
}
// The image side a CNN can take: every pooling window must fit the map it slides over (VGG-16's
// five 2x2 pools halve the side five times; ResNet's 3x3 stem pool follows a stride-2 conv), and
// the largest tensors (the first conv's output, VGG-16's fc6 weight) must stay below a petabyte.
void check_image(std::string_view name, std::uint32_t batch, std::uint32_t image) {
  const std::uint32_t least = name == "vgg16" ? 32 : 5;
  if (image < least)
    throw config_error("model '" + std::string(name) + "': an image side of " + std::to_string(image) +
                       " is too small for its pooling layers; give an image side (--seq) of at least " +
                       std::to_string(least) + " (default 224)");
  const double side = image, fc6 = name == "vgg16" ? 512.0 * std::floor(side / 32) * std::floor(side / 32) * 4096 : 0;
  if (std::max(static_cast<double>(batch) * 64 * side * side, fc6) * 4 > 1e15)
    throw config_error("model '" + std::string(name) + "': batch " + std::to_string(batch) + " and image side " +
                       std::to_string(image) + " make tensors past a petabyte; give smaller shapes");
}
}  // namespace

zoo_model_size zoo_size(std::string_view name, const zoo_options& opt, const trace& t) {
  zoo_model_size out;
  bool transformer = false;
  for (const auto& e : transformers)
    if (name == e.name) {
      transformer = true;
      out.tokens = static_cast<std::uint64_t>(opt.batch ? opt.batch : e.batch) * (opt.seq ? opt.seq : e.seq);
    }
  if (!transformer) {
    if (name != "vgg16" && name != "resnet50" && name != "resnet152")
      throw config_error("unknown model '" + std::string(name) + "'");
    out.tokens = opt.batch ? opt.batch : 64;
  }
  const auto prec = setup_for(opt.precision, transformer, false);
  for (const auto& x : t.tensors)
    if (x.kind == tensor_kind::parameter) out.parameters += x.bytes / prec.act_bytes;
  return out;
}

trace make_model_trace(std::string_view name, const zoo_options& opt) {
  for (const auto& e : transformers)
    if (name == e.name) {
      auto shape = e.shape;
      if (opt.hidden) shape.hidden = opt.hidden;
      if (opt.heads) shape.heads = opt.heads;
      // (The GPT-3 paper's own 13B row, 5140 / 40, is kept as published.)
      if ((opt.hidden || opt.heads) && shape.hidden % shape.heads != 0)
        throw config_error("model '" + std::string(name) + "': " + std::to_string(shape.heads) +
                           " attention heads do not divide the hidden size " + std::to_string(shape.hidden) +
                           " (set --heads to a divisor)");
      const std::uint32_t batch = opt.batch ? opt.batch : e.batch, seq = opt.seq ? opt.seq : e.seq;
      check_shape(name, shape, batch, seq);
      return detail::make_transformer(shape, batch, seq, opt.layers, setup_for(opt.precision, true, opt.clip_grad_norm));
    }
  const std::uint32_t batch = opt.batch ? opt.batch : 64, image = opt.seq ? opt.seq : 224;
  const bool is_cnn = name == "vgg16" || name == "resnet50" || name == "resnet152";
  if (is_cnn && (opt.layers || opt.hidden || opt.heads))
    throw config_error("model '" + std::string(name) +
                       "': layers, hidden and heads set the shape of a transformer; a CNN keeps its published layers");
  if (is_cnn) check_image(name, batch, image);
  const auto prec = setup_for(opt.precision, false, opt.clip_grad_norm);
  if (name == "vgg16") return detail::make_cnn(detail::cnn_kind::vgg16, batch, image, prec);
  if (name == "resnet50") return detail::make_cnn(detail::cnn_kind::resnet50, batch, image, prec);
  if (name == "resnet152") return detail::make_cnn(detail::cnn_kind::resnet152, batch, image, prec);
  std::string list;
  for (const auto& n : zoo_model_names()) list += (list.empty() ? "" : ", ") + n;
  throw config_error("unknown model '" + std::string(name) + "' (zoo: " + list + ")");
}

}  // namespace spillway::offload
