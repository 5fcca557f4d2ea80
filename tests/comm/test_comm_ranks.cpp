// tests/comm: run under `mpirun -np N` (N = 2 and 3 in tests/comm/meson.build): the fixed-order
// reductions against a reference that adds the ranks' buffers in rank order, all-gathers of odd
// sizes, broadcast, chunked and large transfers, mismatched sizes, and a rank that stops answering.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/comm_error.hpp"
#include "comm/communicator.hpp"
#include "comm/message_size.hpp"

namespace {

using namespace std::chrono_literals;
using spillway::comm_error;
using spillway::comm::comm_options;
using spillway::comm::communicator;
using spillway::comm::shard_range;

std::shared_ptr<communicator> g_world;  // made in main (it starts MPI); 20 s timeout

communicator& world() { return *g_world; }

// Rank r's value at i: 1e8, 1, -1e8 patterns, so that the order of the sum shows in its bits,
// mixed with values of every exponent.
float value(int r, std::size_t i) {
  static constexpr float pattern[] = {1e8f, 1.0f, -1e8f, 3.25f, -1.0f, 1e-3f, 7e7f};
  const std::uint64_t h = (static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ULL) ^
                          (static_cast<std::uint64_t>(r + 1) * 0xC2B2AE3D27D4EB4FULL);
  if (i % 4 != 3) return pattern[(i + static_cast<std::size_t>(r)) % 7] * (1.0f + static_cast<float>(i % 5) * 0.25f);
  return static_cast<float>(static_cast<std::int64_t>(h >> 40) - (1 << 23)) * 1.3e-4f;
}

// The reference of Note [Fixed-order reductions]: one process adding the buffers in rank order.
float reference(int ranks, std::size_t i) {
  float s = value(0, i);
  for (int r = 1; r < ranks; ++r) s += value(r, i);
  return s;
}

std::vector<float> my_buffer(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = value(world().rank(), i);
  return x;
}

/// Restores the message size at the end of a test.
struct message_size_scope {
  explicit message_size_scope(std::size_t bytes) : old(spillway::comm::detail::set_max_message_bytes(bytes)) {}
  ~message_size_scope() { spillway::comm::detail::set_max_message_bytes(old); }
  std::size_t old;
};

void expect_same_on_every_rank(const std::vector<float>& x) {
  std::vector<float> root = x;
  world().broadcast(root.data(), root.size() * sizeof(float), 0);
  EXPECT_EQ(0, std::memcmp(root.data(), x.data(), x.size() * sizeof(float))) << "rank " << world().rank();
}

TEST(Ranks, EngineAndSize) {
  EXPECT_EQ(world().engine(), "mpi");
  EXPECT_GE(world().size(), 2) << "run under mpirun -np 2 (or more)";
  world().barrier();
}

TEST(Ranks, ReduceScatterEqualsRankOrderReference) {
  const int n_ranks = world().size(), me = world().rank();
  for (std::size_t n : {0, 1, 2, 5, 1001, 40000}) {
    const auto in = my_buffer(n);
    const auto [b, e] = shard_range(n, n_ranks, me);
    std::vector<float> out(e - b, -7.0f);
    world().reduce_scatter_sum(in.data(), out.data(), n);
    for (std::size_t i = b; i < e; ++i) {
      const float want = reference(n_ranks, i);
      ASSERT_EQ(0, std::memcmp(&out[i - b], &want, sizeof(float)))
          << "n " << n << " element " << i << ": " << out[i - b] << " != " << want;
    }
  }
}

TEST(Ranks, AllReduceSameBitsEverywhereAndEveryTime) {
  const std::size_t n = 30011;
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = reference(world().size(), i);
  for (int repeat = 0; repeat < 3; ++repeat) {
    auto data = my_buffer(n);
    world().all_reduce_sum(data.data(), n);
    ASSERT_EQ(0, std::memcmp(data.data(), want.data(), n * sizeof(float))) << "repeat " << repeat;
    expect_same_on_every_rank(data);
  }
}

TEST(Ranks, ChunkedTransfersGiveTheSameBits) {
  message_size_scope small(4096 + 12);  // not a multiple of the shard: partial last chunks
  const std::size_t n = 100003;
  auto data = my_buffer(n);
  world().all_reduce_sum(data.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const float want = reference(world().size(), i);
    ASSERT_EQ(0, std::memcmp(&data[i], &want, sizeof(float))) << "element " << i;
  }
  std::vector<char> bytes(50001);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(world().rank() == 1 ? i * 7 : 0);
  world().broadcast(bytes.data(), bytes.size(), 1);
  for (std::size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], static_cast<char>(i * 7)) << i;
}

unsigned char gathered_byte(std::size_t element, std::size_t byte) {
  return static_cast<unsigned char>(element * 31 + byte * 7 + 1);
}

TEST(Ranks, AllGatherOddSizesAndElementSizes) {
  const int n_ranks = world().size(), me = world().rank();
  for (std::size_t max_message : {std::size_t{16} << 20, std::size_t{7}}) {
    message_size_scope scope(max_message);
    for (std::size_t n : {0, 1, 2, 3, 7, 1001}) {
      for (std::size_t elem : {1, 2, 3, 8, 12}) {
        const auto [b, e] = shard_range(n, n_ranks, me);
        std::vector<unsigned char> shard((e - b) * elem);
        for (std::size_t i = b; i < e; ++i)
          for (std::size_t k = 0; k < elem; ++k) shard[(i - b) * elem + k] = gathered_byte(i, k);
        std::vector<unsigned char> out(n * elem, 0xEE);
        world().all_gather(shard.data(), out.data(), n, elem);
        for (std::size_t i = 0; i < n; ++i)
          for (std::size_t k = 0; k < elem; ++k)
            ASSERT_EQ(out[i * elem + k], gathered_byte(i, k)) << "n " << n << " elem " << elem << " i " << i;
        // In place: the shard already at its own place in out.
        std::vector<unsigned char> in_place(n * elem, 0xEE);
        if (!shard.empty()) std::memcpy(in_place.data() + b * elem, shard.data(), shard.size());
        world().all_gather(in_place.data() + b * elem, in_place.data(), n, elem);
        ASSERT_EQ(in_place, out);
      }
    }
  }
}

TEST(Ranks, BroadcastFromEveryRoot) {
  for (int root = 0; root < world().size(); ++root) {
    std::vector<int> data(2049, world().rank() == root ? root + 100 : -1);
    world().broadcast(data.data(), data.size() * sizeof(int), root);
    for (int v : data) ASSERT_EQ(v, root + 100);
  }
}

TEST(Ranks, LargeAllReduce64MiB) {
  const std::size_t n = (std::size_t{64} << 20) / sizeof(float);
  auto data = my_buffer(n);
  world().all_reduce_sum(data.data(), n);
  for (std::size_t i = 0; i < n; i += 1 + i % 97) {  // a spread of elements, not all 16M
    const float want = reference(world().size(), i);
    ASSERT_EQ(0, std::memcmp(&data[i], &want, sizeof(float))) << "element " << i;
  }
  ASSERT_EQ(data[n - 1], reference(world().size(), n - 1));
}

TEST(Ranks, MismatchedSizesFailWithAComm_error) {
  auto c = communicator::world({.timeout = 10s});
  const std::size_t n = world().rank() == 0 ? 12 : 15;  // rank 0 disagrees
  std::vector<unsigned char> out(15 * 4), shard(15 * 4, 1);
  try {
    c->all_gather(shard.data(), out.data(), n, 4);
    ADD_FAILURE() << "rank " << world().rank() << ": no error";
  } catch (const comm_error& e) {
    EXPECT_NE(std::string(e.what()).find("every rank must pass the same sizes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("n = 12"), std::string::npos) << e.what();
  }
  // Failed for good: the ranks no longer agree on what comes next.
  EXPECT_THROW(c->barrier(), comm_error);
  world().barrier();  // the shared communicator is not affected
}

// Sizes or roots that differ between ranks fail the collective on every rank, even where the
// bytes would line up (a reduce-scatter whose shards have the same length on two ranks, a
// broadcast whose roots only send), instead of giving some ranks misaligned sums or stale bytes.
TEST(Ranks, MismatchedSizesOrRootsFailOnEveryRank) {
  {
    auto c = communicator::world({.timeout = 10s});
    const std::size_t n = 10 + static_cast<std::size_t>(world().rank());
    std::vector<float> in(n, 1.0F), out(n);
    try {
      c->reduce_scatter_sum(in.data(), out.data(), n);
      ADD_FAILURE() << "rank " << world().rank() << ": no error";
    } catch (const comm_error& e) {
      EXPECT_NE(std::string(e.what()).find("the ranks disagree"), std::string::npos) << e.what();
    }
  }
  {
    auto c = communicator::world({.timeout = 10s});
    std::vector<unsigned char> buf(16, static_cast<unsigned char>(world().rank()));
    try {
      c->broadcast(buf.data(), buf.size(), world().rank());  // every rank thinks it is the root
      ADD_FAILURE() << "rank " << world().rank() << ": no error";
    } catch (const comm_error& e) {
      EXPECT_NE(std::string(e.what()).find("same sizes and root"), std::string::npos) << e.what();
    }
  }
  world().barrier();
}

// Item 6 of issue 19: the last rank stops answering (as if it threw, or hangs) and sleeps past the
// timeout; every other rank's collective fails within it, with a message naming that rank.
TEST(Ranks, ARankThatStopsAnsweringIsNamed) {
  const int last = world().size() - 1;
  auto c = communicator::world({.timeout = 2s});
  if (world().rank() == last) {
    std::this_thread::sleep_for(3500ms);
  } else {
    std::vector<float> data = my_buffer(1000);
    const auto start = std::chrono::steady_clock::now();
    try {
      c->all_reduce_sum(data.data(), data.size());
      ADD_FAILURE() << "no error";
    } catch (const comm_error& e) {
      const std::string want = "all_reduce_sum: rank " + std::to_string(last) +
                               " did not answer within 2 s (it failed, was killed, or is stuck)";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      if (world().size() > 2) {
        EXPECT_NE(std::string(e.what()).find("the other ranks are fine"), std::string::npos) << e.what();
      }
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    EXPECT_GE(waited, 2s);
    EXPECT_LT(waited, 3s);
    EXPECT_THROW(c->barrier(), comm_error);
  }
  // A new communicator is a fresh context: the failed one's leftovers never reach it.
  auto fresh = communicator::world({.timeout = 20s});
  auto data = my_buffer(777);
  fresh->all_reduce_sum(data.data(), data.size());
  for (std::size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], reference(world().size(), i)) << i;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_world = communicator::world({.timeout = std::chrono::seconds(20)});
  // meson's gtest protocol passes --gtest_output=xml:NAME.xml to every rank: rank 0 writes it.
  // InitGoogleTest has already made the XML writer from that flag (clearing the flag now would
  // change nothing), so the other ranks take it out of the listeners: two ranks writing one file
  // leave it unreadable to meson, which then stops the whole test run.
  if (g_world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_xml_generator());
  }
  // A watchdog: nothing here may hang, whatever breaks (mpirun ends the others when one exits).
  std::thread([rank = g_world->rank()] {
    std::this_thread::sleep_for(std::chrono::seconds(90));
    std::fprintf(stderr, "test_comm_ranks: rank %d still running after 90 s: watchdog exit\n", rank);
    std::_Exit(124);
  }).detach();
  const int rc = RUN_ALL_TESTS();
  // Every rank reports whether all passed, so mpirun's exit status covers ranks other than 0.
  g_world.reset();
  return rc;
}
