// Embedding: gather and accumulate-gather, scatter-add backward with repeated ids against a
// reference, bad ids reported at synchronize, cuda against cpu.
#include <gtest/gtest.h>

#include "kernel_rig.hpp"
#include "kernels/embedding.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

TEST(Embedding, ForwardGathersRowsAndAccumulatesPositions) {
  const int vocab = 9, dim = 5, tokens = 6;
  const auto table = random_floats(vocab * dim, 1);
  const auto pos = random_floats(tokens * dim, 2);
  const std::vector<std::int32_t> ids = {3, 0, 8, 3, 5, 1};
  std::vector<std::int32_t> positions(tokens);
  for (int t = 0; t < tokens; ++t) positions[t] = t;
  rig r;
  float* out = r.alloc<float>(tokens * dim);
  embedding_forward(r.ctx(), r.s(), r.up(ids), r.up(table), out, tokens, vocab, dim);
  const auto got = r.down(out, tokens * dim);
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < dim; ++j) EXPECT_EQ(got[t * dim + j], table[ids[t] * dim + j]);
  embedding_forward(r.ctx(), r.s(), r.up(positions), r.up(pos), out, tokens, tokens, dim, true);
  const auto sum = r.down(out, tokens * dim);
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < dim; ++j) EXPECT_EQ(sum[t * dim + j], table[ids[t] * dim + j] + pos[t * dim + j]);
}

TEST(Embedding, BackwardScatterAddsRepeatedIdsInTokenOrder) {
  const int vocab = 7, dim = 40, tokens = 50;  // dim spans several column blocks
  const auto ids = random_ids(tokens, 4, 3);   // only ids 0..3, many repeats
  const auto dout = random_floats(tokens * dim, 4);
  rig r;
  float* dtable = r.up(std::vector<float>(vocab * dim, 7.0f));
  embedding_backward(r.ctx(), r.s(), r.up(ids), r.up(dout), dtable, tokens, vocab, dim, false);
  std::vector<float> want(vocab * dim, 0.0f);  // float, token order: the exact sum the kernel promises
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < dim; ++j) want[ids[t] * dim + j] += dout[t * dim + j];
  const auto got = r.down(dtable, vocab * dim);
  EXPECT_TRUE(same_bits(got, want));
  for (int j = 0; j < dim; ++j) EXPECT_EQ(got[6 * dim + j], 0.0f);  // unused row zeroed
  embedding_backward(r.ctx(), r.s(), r.up(ids), r.up(dout), dtable, tokens, vocab, dim, true);
  const auto twice = r.down(dtable, vocab * dim);
  for (int i = 0; i < vocab * dim; ++i) EXPECT_NEAR(twice[i], 2 * want[i], 1e-5);
}

TEST(Embedding, IdOutsideTheVocabularyIsReportedAtSynchronize) {
  rig r;
  float* out = r.alloc<float>(4);
  embedding_forward(r.ctx(), r.s(), r.up(std::vector<std::int32_t>{0, 4}), r.up(std::vector<float>(8, 1.0f)), out,
                    2, 4, 2);
  EXPECT_THROW(r.sync(), spillway::usage_error);
}

TEST(EmbeddingCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const int vocab = 1000, dim = 96, tokens = 512;
  const auto table = random_floats(vocab * dim, 5);
  const auto ids = random_ids(tokens, 50, 6);
  const auto dout = random_floats(tokens * dim, 7);
  auto run = [&](rig& r) {
    float* out = r.alloc<float>(tokens * dim);
    const std::int32_t* di = r.up(ids);
    embedding_forward(r.ctx(), r.s(), di, r.up(table), out, tokens, vocab, dim);
    float* dt = r.alloc<float>(vocab * dim);
    embedding_backward(r.ctx(), r.s(), di, r.up(dout), dt, tokens, vocab, dim, false);
    return std::pair{r.down(out, tokens * dim), r.down(dt, vocab * dim)};
  };
  rig cpu("cpu"), gpu("cuda");
  const auto want = run(cpu);
  const auto got = run(gpu);
  EXPECT_TRUE(same_bits(got.first, want.first));
  EXPECT_TRUE(same_bits(got.second, want.second));  // same order of adds on both backends
}
