// Embedding: gather and accumulate-gather, scatter-add backward with repeated ids against a
// reference, bad ids named at synchronize with the same message on both backends, cuda against
// cpu.
#include <gtest/gtest.h>

#include <string>
#include <utility>

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

namespace {
// Returns the message of the usage_error that the stream's next synchronize throws, and checks
// that the failure stays.
std::string sync_error(rig& r, const char* what_went_by) {
  std::string what;
  try {
    r.sync();
    ADD_FAILURE() << what_went_by << " went by";
  } catch (const spillway::usage_error& e) {
    what = e.what();
  }
  EXPECT_THROW(r.sync(), spillway::usage_error) << "the failure is sticky";
  return what;
}

// Forward and backward with a vocabulary of 4, each on a rig of the `kind` backend of its own
// (a failure is sticky): each launch returns, and the next synchronize names the first token
// whose id is outside [0, 4), below or past it. Returns both messages.
std::pair<std::string, std::string> outside_the_vocabulary_errors(const char* kind) {
  const int vocab = 4, dim = 3, tokens = 6;
  const auto table = random_floats(vocab * dim, 8);
  rig r(kind);
  float* out = r.alloc<float>(tokens * dim);
  embedding_forward(r.ctx(), r.s(), r.up(std::vector<std::int32_t>{0, 3, -1, 2, 4, 1}), r.up(table), out, tokens,
                    vocab, dim);
  const std::string forward = sync_error(r, "id -1 of a vocabulary of 4");
  EXPECT_NE(forward.find("embedding: id -1 of token 2 is outside the vocabulary of 4"), std::string::npos) << forward;

  rig fresh(kind);
  float* dtable = fresh.alloc<float>(vocab * dim);
  embedding_backward(fresh.ctx(), fresh.s(), fresh.up(std::vector<std::int32_t>{1, 1, 3, 7, 0, -5}),
                     fresh.up(random_floats(tokens * dim, 9)), dtable, tokens, vocab, dim, false);
  const std::string backward = sync_error(fresh, "id 7 of a vocabulary of 4");
  EXPECT_NE(backward.find("embedding: id 7 of token 3 is outside the vocabulary of 4"), std::string::npos)
      << backward;
  return {forward, backward};
}

// Lookups and gradients with every id inside the vocabulary and no synchronize between them:
// none reports anything. On the cuda backend 2 * 800 launches are more than a page of report
// slots holds, so the pool usually takes another page.
void many_good_launches(rig& r, int launches) {
  const int vocab = 5, dim = 4, tokens = 3;
  const std::int32_t* ids = r.up(std::vector<std::int32_t>{4, 0, 4});
  const float* table = r.up(random_floats(vocab * dim, 10));
  const float* dout = r.up(random_floats(tokens * dim, 11));
  float* out = r.alloc<float>(tokens * dim);
  float* dtable = r.alloc<float>(vocab * dim);
  for (int i = 0; i < launches; ++i) {
    embedding_forward(r.ctx(), r.s(), ids, table, out, tokens, vocab, dim);
    embedding_backward(r.ctx(), r.s(), ids, dout, dtable, tokens, vocab, dim, false);
  }
  EXPECT_NO_THROW(r.sync());
}
}  // namespace

TEST(Embedding, TheFirstIdOutsideTheVocabularyIsNamedAtSynchronize) {
  rig r;
  many_good_launches(r, 3);
  (void)outside_the_vocabulary_errors("cpu");
}

TEST(EmbeddingCuda, IdOutsideTheVocabularyIsReportedAtSynchronizeAsOnTheCpu) {
  SPILLWAY_NEEDS_CUDA();
  {
    rig gpu("cuda");
    many_good_launches(gpu, 800);
  }
  EXPECT_EQ(outside_the_vocabulary_errors("cuda"), outside_the_vocabulary_errors("cpu"));
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
