// The examples' synthetic data: rng::discard is that many draws, and what is drawn at once
// (normal_values in blocks, the CNN's images) is the bits of one generator, on one thread or many.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <random>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "../swap/swap_test_support.hpp"
#include "device/error.hpp"
#include "examples/cnn/images.hpp"
#include "examples/common/random.hpp"
#include "examples/gpt/corpus.hpp"

namespace spillway::examples {
namespace {

TEST(ExampleData, DiscardIsThatManyDraws) {
  std::mt19937_64 pick(11);
  for (int round = 0; round < 200; ++round) {
    const std::uint64_t seed = pick(), n = pick() % 5000;
    rng skipped(seed, 3, round), drawn(seed, 3, round);
    skipped.discard(n);
    for (std::uint64_t i = 0; i < n; ++i) (void)drawn.next();
    for (int i = 0; i < 4; ++i) ASSERT_EQ(skipped.next(), drawn.next()) << "round " << round << ", n " << n;
  }
}

// normal_values draws in blocks at once: the values of one generator, and the generator left
// where that many draws leave it, for sizes below, at and across its blocks.
TEST(ExampleData, NormalValuesAreOneGeneratorsDraws) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{10001}}) {
    rng blocks(17, 2, n), one(17, 2, n);
    const auto v = normal_values(blocks, n, 0.5);
    ASSERT_EQ(v.size(), n);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], static_cast<float>(one.normal() * 0.5)) << "n " << n << ", value " << i;
    EXPECT_EQ(blocks.next(), one.next()) << "n " << n;
  }
}

std::string corpus_error(const std::string& path, std::size_t min_bytes) {
  try {
    (void)load_corpus(path, min_bytes);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

// --data: a file's bytes; a folder, a missing file or one too short for a sequence is a
// config_error naming the path and what would do, never a stream's own exception.
TEST(ExampleData, CorpusIsAFilesBytesAndAnythingElseIsRefusedByName) {
  spillway::test::temp_dir d;
  const std::string file = d.path() + "/text.txt";
  std::ofstream(file, std::ios::binary) << std::string("ab\0cd", 5);
  EXPECT_EQ(load_corpus(file, 5), std::string("ab\0cd", 5));
  auto msg = corpus_error(file, 6);
  EXPECT_NE(msg.find("has 5 bytes; the model needs at least 6"), std::string::npos) << msg;
  msg = corpus_error(d.path(), 1);
  EXPECT_NE(msg.find("--data " + d.path() + ": is a folder; give a text file"), std::string::npos) << msg;
  msg = corpus_error(d.path() + "/missing.txt", 1);
  EXPECT_NE(msg.find("--data " + d.path() + "/missing.txt: cannot open the corpus: No such file"), std::string::npos) << msg;
}

struct images {
  std::vector<float> pixels;
  std::vector<std::int32_t> labels;
};

images draw(int batch, int channels, int size, int classes, std::int64_t step) {
  images out;
  make_images(5, step, batch, channels, size, classes, out.pixels, out.labels);
  return out;
}

bool same_bits(const images& a, const images& b) {
  return a.labels == b.labels && a.pixels.size() == b.pixels.size() &&
         std::memcmp(a.pixels.data(), b.pixels.data(), a.pixels.size() * sizeof(float)) == 0;
}

TEST(ExampleData, ImagesAreTheSameBitsOnOneThreadAndOnMany) {
  for (const auto& [batch, channels, size, classes] :
       std::vector<std::array<int, 4>>{{{9, 3, 16, 8}}, {{4, 1, 7, 3}}, {{16, 2, 12, 5}}}) {
    const auto many = draw(batch, channels, size, classes, 3);
    images one;
    tbb::task_arena(1).execute([&, batch = batch, channels = channels, size = size, classes = classes] {
      one = draw(batch, channels, size, classes, 3);
    });
    EXPECT_TRUE(same_bits(many, one)) << batch << " images of " << channels << "x" << size << "x" << size;
    // Image n depends on n and the step alone: a smaller batch is the larger one's first images.
    const auto fewer = draw(batch - 1, channels, size, classes, 3);
    const std::size_t per = static_cast<std::size_t>(channels) * static_cast<std::size_t>(size * size);
    EXPECT_EQ(std::memcmp(fewer.pixels.data(), many.pixels.data(), fewer.pixels.size() * sizeof(float)), 0);
    EXPECT_EQ(std::vector<std::int32_t>(many.labels.begin(), many.labels.end() - 1), fewer.labels);
    EXPECT_EQ(many.pixels.size(), per * static_cast<std::size_t>(batch));
    // Another step, other images.
    EXPECT_FALSE(same_bits(many, draw(batch, channels, size, classes, 4)));
  }
}

}  // namespace
}  // namespace spillway::examples
