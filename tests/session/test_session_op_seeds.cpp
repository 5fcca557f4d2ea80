// op_scope::seed() across failures and checkpoints (Note [Op seeds] in offload/session.cpp): a
// step run again after it failed or was given up draws what its first attempt drew, and a run
// resumed from a checkpoint in a new Session draws what the run that saved would have drawn
// next, so both end with the weights of a run that never failed nor stopped.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/units.hpp"
#include "offload/session_config.hpp"
#include "offload/swap_policy.hpp"
#include "../swap/swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr std::size_t words = 4096;
constexpr std::uint64_t bytes = words * sizeof(std::uint32_t);
using vec = std::vector<std::uint32_t>;

session_config config() {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.policy = "none";
  c.cpu_debug_host_access = true;
  return c;
}

// A loop whose one forward op drops a quarter of its words by a mask drawn from op.seed().
class loop {
 public:
  explicit loop(Session& s) : s_(s), w_(s.add_persistent("w", bytes, tensor_kind::parameter, initial().data())) {}

  enum class trouble { none, failed_update, given_up };
  // Runs step `step` (from 1). failed_update: the update's body throws before it writes anything;
  // given_up: the loop gives the step up after its forward op (abandon_iteration).
  void step(int step, trouble how = trouble::none) {
    const bool fail = how == trouble::failed_update;
    const auto st = static_cast<std::uint32_t>(step);
    s_.begin_iteration();
    const auto x = s_.add_transient("x", bytes), h = s_.add_transient("h", bytes);
    {
      auto op = s_.op("input", {}, {x});
      op.run([&](const host_access& a) {
        for (std::size_t i = 0; i < words; ++i) a.ptr<std::uint32_t>(x)[i] = static_cast<std::uint32_t>(i) * 2654435761u + st;
      });
    }
    const auto w = w_;
    std::map<int, std::vector<std::uint64_t>>& seeds = seeds_;
    s_.recomputable_op("dropout.forward", {w, x}, {h}, [=, &seeds](const Session::op_scope& op) {
      const std::uint64_t seed = op.seed();
      seeds[step].push_back(seed);
      op.run([&](const host_access& a) {
        std::mt19937_64 gen(seed);
        for (std::size_t i = 0; i < words; ++i)
          a.ptr<std::uint32_t>(h)[i] = (gen() & 3u) == 0 ? 0 : a.ptr<std::uint32_t>(w)[i] ^ a.ptr<std::uint32_t>(x)[i];
      });
    });
    s_.release(x);
    if (how == trouble::given_up) {
      s_.abandon_iteration();
      return;
    }
    {
      auto op = s_.op("update", {w_, h}, {w_});
      op.run([&](const host_access& a) {
        if (fail) throw std::runtime_error("the update failed");
        for (std::size_t i = 0; i < words; ++i) a.ptr<std::uint32_t>(w_)[i] += a.ptr<std::uint32_t>(h)[i] >> 3;
      });
    }
    s_.release(h);
    s_.end_iteration();
  }

  [[nodiscard]] vec weights() const {
    vec out(words);
    s_.read(w_, out.data(), bytes);
    return out;
  }
  // Per step, the seed each run of the forward op saw (a failed attempt's too).
  [[nodiscard]] const std::map<int, std::vector<std::uint64_t>>& seeds() const { return seeds_; }

 private:
  static vec initial() {
    vec v(words);
    for (std::size_t i = 0; i < words; ++i) v[i] = static_cast<std::uint32_t>(i * 7 + 1);
    return v;
  }
  Session& s_;
  tensor_handle w_;
  std::map<int, std::vector<std::uint64_t>> seeds_;
};

struct run_result {
  vec w;
  std::map<int, std::uint64_t> seed;  // per step: the seed its forward op saw
};

run_result uninterrupted(int steps) {
  Session s(config());
  loop l(s);
  for (int k = 1; k <= steps; ++k) l.step(k);
  run_result r{l.weights(), {}};
  for (const auto& [k, list] : l.seeds()) r.seed[k] = list.front();
  return r;
}

}  // namespace

// The loop gives step 2 up once (abandon_iteration), step 3 fails once in its update, and the loop
// runs each again: every attempt draws the mask of the run that never failed, and the weights end
// as that run's. (A count of iterations begun would give each second attempt, and every step
// after it, other masks.)
TEST(SessionOpSeeds, AStepRunAgainAfterItFailedDrawsWhatItsFailedAttemptDrew) {
  const auto want = uninterrupted(4);
  Session s(config());
  loop l(s);
  l.step(1);
  l.step(2, loop::trouble::given_up);
  l.step(2);
  EXPECT_THROW(l.step(3, loop::trouble::failed_update), std::runtime_error);
  l.step(3);  // begin_iteration ends the failed attempt first (Note [Failed iterations])
  l.step(4);
  ASSERT_EQ(l.seeds().at(2).size(), 2u) << "the given-up attempt did not reach the forward op";
  ASSERT_EQ(l.seeds().at(3).size(), 2u) << "the failed attempt did not reach the forward op";
  for (const auto& [k, list] : l.seeds())
    for (const auto seed : list) EXPECT_EQ(seed, want.seed.at(k)) << "step " << k;
  EXPECT_EQ(l.weights(), want.w);
}

// Two steps, save, and steps 3 and 4 in a new Session that loads the checkpoint: the masks and the
// weights of four steps in one Session.
TEST(SessionOpSeeds, ARunResumedInANewSessionDrawsWhatTheRunThatSavedWouldHave) {
  const auto want = uninterrupted(4);
  EXPECT_NE(want.seed.at(1), want.seed.at(3));
  test::temp_dir dir;
  {
    Session s(config());
    loop l(s);
    l.step(1);
    l.step(2);
    s.save(dir.path(), "after step 2");
  }
  Session s(config());
  loop l(s);
  EXPECT_EQ(s.load(dir.path()), "after step 2");
  l.step(3);
  l.step(4);
  EXPECT_EQ(l.seeds().at(3).front(), want.seed.at(3));
  EXPECT_EQ(l.seeds().at(4).front(), want.seed.at(4));
  EXPECT_EQ(l.weights(), want.w);
}
