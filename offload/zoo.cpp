// Zoo: the list of models, their default batch and sequence length, and the dispatch to
// the family generators (shapes from the GPT-2, GPT-3, BERT, VGG and ResNet papers).
#include "offload/zoo.hpp"

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

trace make_model_trace(std::string_view name, const zoo_options& opt) {
  for (const auto& e : transformers)
    if (name == e.name)
      return detail::make_transformer(e.shape, opt.batch ? opt.batch : e.batch, opt.seq ? opt.seq : e.seq, opt.layers);
  const std::uint32_t batch = opt.batch ? opt.batch : 64, image = opt.seq ? opt.seq : 224;
  if (name == "vgg16") return detail::make_cnn(detail::cnn_kind::vgg16, batch, image);
  if (name == "resnet50") return detail::make_cnn(detail::cnn_kind::resnet50, batch, image);
  if (name == "resnet152") return detail::make_cnn(detail::cnn_kind::resnet152, batch, image);
  std::string list;
  for (const auto& n : zoo_model_names()) list += (list.empty() ? "" : ", ") + n;
  throw config_error("unknown model '" + std::string(name) + "' (zoo: " + list + ")");
}

}  // namespace spillway::offload
