// tests/comm: one process: shard_range (examples and a property test), solo() and a world of one
// (no mpirun) as copies, the fixed-order sum, and the errors for bad arguments.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "comm/comm_error.hpp"
#include "comm/communicator.hpp"
#include "comm/fixed_order_sum.hpp"
#include "comm/message_size.hpp"
#include "../test_seed.hpp"

namespace {

using spillway::usage_error;
using spillway::comm::communicator;
using spillway::comm::shard_range;

TEST(ShardRange, Examples) {
  EXPECT_EQ(shard_range(10, 3, 0), (std::pair<std::size_t, std::size_t>{0, 4}));
  EXPECT_EQ(shard_range(10, 3, 1), (std::pair<std::size_t, std::size_t>{4, 7}));
  EXPECT_EQ(shard_range(10, 3, 2), (std::pair<std::size_t, std::size_t>{7, 10}));
  EXPECT_EQ(shard_range(2, 4, 3), (std::pair<std::size_t, std::size_t>{2, 2}));
  EXPECT_EQ(shard_range(0, 1, 0), (std::pair<std::size_t, std::size_t>{0, 0}));
}

TEST(ShardRange, RejectsBadRanks) {
  EXPECT_THROW((void)shard_range(10, 0, 0), usage_error);
  EXPECT_THROW((void)shard_range(10, -2, 0), usage_error);
  EXPECT_THROW((void)shard_range(10, 3, 3), usage_error);
  EXPECT_THROW((void)shard_range(10, 3, -1), usage_error);
}

// Property: the shards are consecutive, cover [0, n) exactly, and the first n % ranks are the
// ones with one element more.
TEST(ShardRange, PropertyConsecutiveBalancedCovering) {
  std::mt19937_64 rng(spillway::test::test_seed(19));
  for (int iter = 0; iter < 2000; ++iter) {
    const std::size_t n = iter % 10 == 0 ? (rng() >> 20) : rng() % 5000;
    const int ranks = 1 + static_cast<int>(rng() % 70);
    std::size_t next = 0;
    for (int r = 0; r < ranks; ++r) {
      const auto [b, e] = shard_range(n, ranks, r);
      ASSERT_EQ(b, next) << "n " << n << " ranks " << ranks << " r " << r;
      ASSERT_LE(b, e);
      const std::size_t want = n / static_cast<std::size_t>(ranks) +
                               (static_cast<std::size_t>(r) < n % static_cast<std::size_t>(ranks) ? 1 : 0);
      ASSERT_EQ(e - b, want) << "n " << n << " ranks " << ranks << " r " << r;
      next = e;
    }
    ASSERT_EQ(next, n);
  }
}

TEST(FixedOrderSum, AddsInRankOrderInFp32) {
  // (1e8 + 1) - 1e8 is 0 in fp32 (1e8 + 1 rounds to 1e8); any other order, or double, gives 1.
  const std::vector<float> x0(3000, 1e8f), x1(3000, 1.0f), x2(3000, -1e8f);
  const float* src[] = {x0.data(), x1.data(), x2.data()};
  std::vector<float> out(3000, 42.0f);
  spillway::comm::detail::fixed_order_sum(src, 3, out.data(), out.size());
  for (float v : out) ASSERT_EQ(v, 0.0f);
  const float* other[] = {x0.data(), x2.data(), x1.data()};
  spillway::comm::detail::fixed_order_sum(other, 3, out.data(), out.size());
  for (float v : out) ASSERT_EQ(v, 1.0f);
}

TEST(FixedOrderSum, OutMayBeASourceAtItsPlace) {
  std::vector<float> a(2500), b(2500);
  std::iota(a.begin(), a.end(), 0.5f);
  std::iota(b.begin(), b.end(), 1e7f);
  std::vector<float> want(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) want[i] = b[i] + a[i];
  const float* src[] = {b.data(), a.data()};
  spillway::comm::detail::fixed_order_sum(src, 2, a.data(), a.size());
  EXPECT_EQ(0, std::memcmp(a.data(), want.data(), a.size() * sizeof(float)));
}

TEST(MessageSize, RejectsTooSmallAndTooLarge) {
  EXPECT_THROW(spillway::comm::detail::set_max_message_bytes(0), usage_error);
  EXPECT_THROW(spillway::comm::detail::set_max_message_bytes(std::size_t{1} << 31), usage_error);
}

// solo() and a world of one behave alike: every collective is a copy.
class OneRank : public ::testing::TestWithParam<const char*> {
 protected:
  std::shared_ptr<communicator> make() {
    return std::string(GetParam()) == "solo" ? communicator::solo() : communicator::world();
  }
};

TEST_P(OneRank, IsRankZeroOfOne) {
  auto c = make();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->engine(), GetParam());
  c->barrier();
}

TEST_P(OneRank, CollectivesAreCopies) {
  auto c = make();
  std::vector<float> in = {1e8f, 1.0f, -1e8f, 3.5f, -0.0f};
  std::vector<float> data = in;
  c->all_reduce_sum(data.data(), data.size());
  EXPECT_EQ(0, std::memcmp(data.data(), in.data(), in.size() * sizeof(float)));
  std::vector<float> out(in.size(), 7.0f);
  c->reduce_scatter_sum(in.data(), out.data(), in.size());
  EXPECT_EQ(0, std::memcmp(out.data(), in.data(), in.size() * sizeof(float)));
  for (std::size_t elem : {1, 3, 8}) {
    std::vector<unsigned char> shard(7 * elem), gathered(7 * elem, 0xEE);
    for (std::size_t i = 0; i < shard.size(); ++i) shard[i] = static_cast<unsigned char>(i * 13 + 1);
    c->all_gather(shard.data(), gathered.data(), 7, elem);
    EXPECT_EQ(shard, gathered);
    c->all_gather(gathered.data(), gathered.data(), 7, elem);  // in place
    EXPECT_EQ(shard, gathered);
  }
  std::vector<char> bytes = {'a', 'b', 'c'};
  c->broadcast(bytes.data(), bytes.size(), 0);
  EXPECT_EQ(bytes, (std::vector<char>{'a', 'b', 'c'}));
  c->all_reduce_sum(nullptr, 0);  // nothing to do is fine
  c->all_gather(nullptr, nullptr, 0, 4);
}

TEST_P(OneRank, BadArgumentsAreUsageErrors) {
  auto c = make();
  float x = 1.0f;
  EXPECT_THROW(c->all_reduce_sum(nullptr, 3), usage_error);
  EXPECT_THROW(c->reduce_scatter_sum(nullptr, &x, 1), usage_error);
  EXPECT_THROW(c->reduce_scatter_sum(&x, nullptr, 1), usage_error);
  EXPECT_THROW(c->all_gather(&x, &x, 1, 0), usage_error);
  EXPECT_THROW(c->all_gather(&x, nullptr, 1, 4), usage_error);
  EXPECT_THROW(c->all_gather(&x, &x, SIZE_MAX / 2, 4), usage_error);
  EXPECT_THROW(c->broadcast(&x, sizeof x, 1), usage_error);
  EXPECT_THROW(c->broadcast(&x, sizeof x, -1), usage_error);
  EXPECT_THROW(c->broadcast(nullptr, 4, 0), usage_error);
  try {
    c->broadcast(&x, sizeof x, 3);
    FAIL() << "no error";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast: root 3 is not a rank of 1"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, OneRank, ::testing::Values("solo", "mpi"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
