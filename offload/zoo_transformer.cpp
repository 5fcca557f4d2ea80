// Zoo: transformer traces (GPT-2 family, GPT-3-style 6.7B and 13B, BERT-large) from their
// published shapes. Pre-LN blocks, attention with the softmax probabilities kept for backward
// (no flash attention), no dropout, tied input/output embeddings; residual adds hand their
// gradient to both branches (Note [Adds pass their gradient on] in zoo_builder.cpp).
#include <string>

#include "offload/zoo_builder.hpp"
#include "offload/zoo_detail.hpp"

namespace spillway::offload::detail {

trace make_transformer(const transformer_shape& s, std::uint32_t batch, std::uint32_t seq, std::uint32_t layers,
                       const precision_setup& prec) {
  model_builder m(prec.act_bytes, prec.mixed, prec.clip);
  const std::uint64_t T = static_cast<std::uint64_t>(batch) * seq;
  const std::uint64_t h = s.hidden;
  const double Td = static_cast<double>(T), hd = static_cast<double>(h);
  const std::uint32_t L = layers ? layers : s.layers;
  using op = model_builder::fwd_op;

  const auto tokens = m.input("tokens", T, 4);
  const auto labels = m.input("labels", T, 4);
  const auto wte = m.param("wte", static_cast<std::uint64_t>(s.vocab) * h, 0);
  const auto wpe = m.param("wpe", static_cast<std::uint64_t>(seq) * h, 0);
  auto x = m.act("embed.out", T * h);
  m.fwd(op{"embed", "embedding", 0, {tokens}, {wte, wpe}, {x}, {tokens}, 2 * Td * hd, 2 * Td * hd, 0});

  auto matmul = [&](const std::string& name, std::int32_t layer, tensor_id in, std::uint64_t k, std::uint64_t n) {
    const auto w = m.param(name + ".w", k * n + n, layer);
    const auto out = m.act(name + ".out", T * n);
    const double fl = 2 * Td * static_cast<double>(k) * static_cast<double>(n);
    m.fwd(op{name, "matmul", layer, {in}, {w}, {out}, {in}, fl, 2 * fl, 0});
    return out;
  };
  auto norm = [&](const std::string& name, std::int32_t layer, tensor_id in) {
    const auto w = m.param(name + ".w", 2 * h, layer);
    const auto out = m.act(name + ".out", T * h);
    m.fwd(op{name, "norm", layer, {in}, {w}, {out}, {in}, 8 * Td * hd, 16 * Td * hd, 0});
    return out;
  };
  auto add = [&](const std::string& name, std::int32_t layer, tensor_id a, tensor_id b) {
    const auto out = m.act(name + ".out", T * h);
    m.fwd(op{name, "elementwise", layer, {a, b}, {}, {out}, {}, Td * hd, 2 * Td * hd, 0, true});
    return out;
  };
  auto gelu = [&](const std::string& name, std::int32_t layer, tensor_id in, std::uint64_t width) {
    const auto out = m.act(name + ".out", T * width);
    const double e = Td * static_cast<double>(width);
    m.fwd(op{name, "elementwise", layer, {in}, {}, {out}, {in}, 8 * e, 16 * e, 0});
    return out;
  };

  const double scores = static_cast<double>(batch) * seq * static_cast<double>(seq);
  for (std::uint32_t l = 0; l < L; ++l) {
    const auto layer = static_cast<std::int32_t>(l + 1);
    const std::string p = "h" + std::to_string(l) + ".";
    const auto a = norm(p + "ln1", layer, x);
    const auto qkv = matmul(p + "attn.qkv", layer, a, h, 3 * h);
    const auto probs = m.act(p + "attn.probs", static_cast<std::uint64_t>(batch) * s.heads * seq * seq);
    const double sfl = 2 * scores * hd + 5 * scores * s.heads;
    m.fwd(op{p + "attn.scores", "attention", layer, {qkv}, {}, {probs}, {qkv, probs}, sfl, 2 * sfl, 0});
    const auto ctx = m.act(p + "attn.ctx", T * h);
    m.fwd(op{p + "attn.context", "attention", layer, {probs, qkv}, {}, {ctx}, {probs, qkv}, 2 * scores * hd,
             4 * scores * hd, 0});
    const auto proj = matmul(p + "attn.proj", layer, ctx, h, h);
    const auto x1 = add(p + "add1", layer, x, proj);
    const auto c = norm(p + "ln2", layer, x1);
    const auto f1 = matmul(p + "mlp.fc1", layer, c, h, 4 * h);
    const auto g = gelu(p + "mlp.gelu", layer, f1, 4 * h);
    const auto f2 = matmul(p + "mlp.fc2", layer, g, 4 * h, h);
    x = add(p + "add2", layer, x1, f2);
  }
  const auto head = static_cast<std::int32_t>(L + 1);
  if (s.mlm_head) {
    const auto d = matmul("mlm.dense", head, x, h, h);
    x = gelu("mlm.gelu", head, d, h);
  }
  const auto xf = norm("ln_f", head, x);
  const auto logits = m.act("lm_head.logits", T * s.vocab);
  const double hfl = 2 * Td * hd * s.vocab;
  m.fwd(op{"lm_head", "matmul", head, {xf}, {wte}, {logits}, {xf}, hfl, 2 * hfl, 0});
  m.loss("loss", logits, labels, head);
  return m.finish();
}

}  // namespace spillway::offload::detail
