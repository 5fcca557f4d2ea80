// Session::write: a persistent tensor's contents replaced from the host between iterations,
// wherever the plan keeps it (device, host tier, NVMe), as a loop loads weights of its own format,
// swaps an averaged copy in for an evaluation and back, or initialises a layer again. Random writes
// between steps of a loop with a flat parameter buffer split into views, checked step by step
// against a host model of the same integer arithmetic, at every policy and a tight budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/swap_policy.hpp"
#include "../swap/swap_test_support.hpp"
#include "loop_config.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;
using spillway::testing::config_for;

namespace {

constexpr int layers = 4;
constexpr std::size_t words = 2048;  // per layer
using words_t = std::vector<std::uint32_t>;

/// The loop's state on the host, and one step of it in plain code.
struct model {
  words_t flat = words_t(layers * words);  // every layer's weights, one buffer
  std::vector<words_t> m = std::vector<words_t>(layers, words_t(words));
  words_t loss = words_t(8);

  void step(int it) {
    words_t x(words), g(words);
    std::vector<words_t> acts;
    for (int l = 0; l < layers; ++l) {
      for (std::size_t i = 0; i < words; ++i)
        x[i] = (l == 0 ? static_cast<std::uint32_t>(it + i) : acts.back()[i]) * 2654435761u ^ flat[l * words + i];
      acts.push_back(x);
    }
    for (std::size_t j = 0; j < loss.size(); ++j) {
      loss[j] = 0;
      for (std::size_t i = j; i < words; i += loss.size()) loss[j] += acts.back()[i];
    }
    for (int l = layers - 1; l >= 0; --l) {
      for (std::size_t i = 0; i < words; ++i) g[i] = acts[l][i] >> 3;
      for (std::size_t i = 0; i < words; ++i) {
        m[l][i] = m[l][i] * 3 + g[i];
        flat[l * words + i] += m[l][i] >> 7;
      }
    }
  }
};

/// The same loop through a Session: `flat` a parent with a view per layer.
class loop {
 public:
  loop(Session& s, const model& init) : s_(s) {
    flat_ = s.add_persistent("flat", layers * words * 4, tensor_kind::parameter, init.flat.data());
    for (int l = 0; l < layers; ++l) {
      w_.push_back(s.add_view(flat_, l * words * 4, words * 4, "w" + std::to_string(l)));
      g_.push_back(s.add_persistent("g" + std::to_string(l), words * 4, tensor_kind::gradient));
      m_.push_back(s.add_persistent("m" + std::to_string(l), words * 4, tensor_kind::optimizer_state, init.m[l].data()));
    }
  }
  words_t step(int it) {
    s_.begin_iteration();
    std::vector<tensor_handle> a;
    for (int l = 0; l < layers; ++l) {
      a.push_back(s_.add_transient("a" + std::to_string(l), words * 4));
      std::vector<tensor_handle> reads{w_[l]};
      if (l > 0) reads.push_back(a[l - 1]);
      const std::vector<tensor_handle> writes{a[l]};
      auto op = s_.op("fwd" + std::to_string(l), reads, writes);
      op.run([&](const Session::op_scope::host_access& h) {
        for (std::size_t i = 0; i < words; ++i)
          h.ptr<std::uint32_t>(a[l])[i] =
              (l == 0 ? static_cast<std::uint32_t>(it + i) : h.ptr<std::uint32_t>(a[l - 1])[i]) * 2654435761u ^
              h.ptr<std::uint32_t>(w_[l])[i];
      });
    }
    auto loss = s_.add_transient("loss", 32, tensor_kind::metric);
    {
      auto op = s_.op("loss", {a.back()}, {loss});
      op.run([&](const Session::op_scope::host_access& h) {
        for (std::size_t j = 0; j < 8; ++j) {
          std::uint32_t sum = 0;
          for (std::size_t i = j; i < words; i += 8) sum += h.ptr<std::uint32_t>(a.back())[i];
          h.ptr<std::uint32_t>(loss)[j] = sum;
        }
      });
    }
    words_t got(8);
    s_.read(loss, got.data(), 32);
    for (int l = layers - 1; l >= 0; --l) {
      {
        auto op = s_.op("bwd" + std::to_string(l), {a[l]}, {g_[l]});
        op.run([&](const Session::op_scope::host_access& h) {
          for (std::size_t i = 0; i < words; ++i) h.ptr<std::uint32_t>(g_[l])[i] = h.ptr<std::uint32_t>(a[l])[i] >> 3;
        });
      }
      s_.release(a[l]);
      auto op = s_.op("adam" + std::to_string(l), {g_[l], m_[l], w_[l]}, {m_[l], w_[l]});
      op.run([&](const Session::op_scope::host_access& h) {
        for (std::size_t i = 0; i < words; ++i) {
          h.ptr<std::uint32_t>(m_[l])[i] = h.ptr<std::uint32_t>(m_[l])[i] * 3 + h.ptr<std::uint32_t>(g_[l])[i];
          h.ptr<std::uint32_t>(w_[l])[i] += h.ptr<std::uint32_t>(m_[l])[i] >> 7;
        }
      });
    }
    s_.release(loss);
    (void)s_.end_iteration();
    return got;
  }
  model values() {
    model v;
    s_.read(flat_, v.flat.data(), v.flat.size() * 4);
    for (int l = 0; l < layers; ++l) s_.read(m_[l], v.m[l].data(), words * 4);
    return v;
  }

  Session& s_;
  tensor_handle flat_;
  std::vector<tensor_handle> w_, g_, m_;
};

words_t random_words(std::mt19937_64& rng, std::size_t n) {
  words_t v(n);
  for (auto& x : v) x = static_cast<std::uint32_t>(rng());
  return v;
}

TEST(SessionWrite, RandomWritesBetweenStepsGiveTheHostModelsValuesAtEveryPolicyAndTier) {
  const std::uint64_t seed = spillway::test::test_seed(41);
  for (const char* policy : {"none", "lms", "auto", "checkpoint"}) {
    for (const bool nvme : {false, true}) {
      SCOPED_TRACE(std::string(policy) + (nvme ? " nvme" : "") + " seed " + std::to_string(seed));
      test::temp_dir dir;
      session_config c = config_for(policy, std::string(policy) == "none" ? 0 : 0.5);
      if (nvme) {
        c.host_budget = 4_KiB;  // what leaves the device goes to NVMe
        c.nvme.directories = {dir.path()};
        c.nvme.reserve = 16_MiB;
      }
      std::mt19937_64 rng(seed);
      model want;
      want.flat = random_words(rng, want.flat.size());
      Session s(c);
      loop l(s, want);
      int writes = 0;
      for (int it = 1; it <= 10; ++it) {
        ASSERT_EQ(l.step(it), (want.step(it), want.loss)) << "step " << it;
        switch (rng() % 4) {
          case 0: {  // the whole flat buffer, as weights loaded from a file
            want.flat = random_words(rng, want.flat.size());
            s.write(l.flat_, want.flat.data(), want.flat.size() * 4);
            ++writes;
            break;
          }
          case 1: {  // one layer's view, initialised again
            const int k = static_cast<int>(rng() % layers);
            const auto v = random_words(rng, words);
            std::copy(v.begin(), v.end(), want.flat.begin() + static_cast<std::ptrdiff_t>(k * words));
            s.write(l.w_[k], v.data(), words * 4);
            ++writes;
            break;
          }
          case 2: {  // an optimizer moment
            const int k = static_cast<int>(rng() % layers);
            want.m[k] = random_words(rng, words);
            s.write(l.m_[k], want.m[k].data(), words * 4);
            ++writes;
            break;
          }
          default: break;
        }
      }
      EXPECT_GT(writes, 3);
      const model got = l.values();
      EXPECT_EQ(got.flat, want.flat);
      EXPECT_EQ(got.m, want.m);
      EXPECT_TRUE(s.history().back().planned);
    }
  }
}

// An averaged copy swapped in for an evaluation and the trained weights put back after it: the
// evaluation sees the averaged weights, training goes on from its own.
TEST(SessionWrite, AnAveragedCopySwappedInForEvaluationAndBack) {
  model want;
  for (std::size_t i = 0; i < want.flat.size(); ++i) want.flat[i] = static_cast<std::uint32_t>(i * 31 + 7);
  Session s(config_for("auto", 0.5));
  loop l(s, want);
  words_t average = want.flat;
  for (int it = 1; it <= 8; ++it) {
    ASSERT_EQ(l.step(it), (want.step(it), want.loss));
    for (std::size_t i = 0; i < average.size(); ++i) average[i] = average[i] / 2 + want.flat[i] / 2;
    if (it % 4 != 0) continue;
    words_t trained(want.flat.size());
    s.read(l.flat_, trained.data(), trained.size() * 4);
    EXPECT_EQ(trained, want.flat);
    s.write(l.flat_, average.data(), average.size() * 4);
    EXPECT_EQ(l.values().flat, average) << "the averaged copy is in place";
    s.write(l.flat_, trained.data(), trained.size() * 4);
  }
  EXPECT_EQ(l.values().flat, want.flat);
}

TEST(SessionWrite, MisuseIsRefusedBeforeAnythingChanges) {
  Session s(config_for("none", 0));
  words_t w0(words, 5), host(words, 9);
  auto w = s.add_persistent("w", words * 4, tensor_kind::parameter, w0.data());
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const usage_error& e) {
      return std::string(e.what());
    }
    return std::string("no usage_error");
  };
  EXPECT_NE(message([&] { s.write(w, host.data(), 4); }).find("given 4 bytes; it has 8192"), std::string::npos);
  EXPECT_NE(message([&] { s.write(w, nullptr, words * 4); }).find("host is null"), std::string::npos);
  s.begin_iteration();
  auto t = s.add_transient("t", words * 4);
  EXPECT_NE(message([&] { s.write(w, host.data(), words * 4); }).find("inside an iteration"), std::string::npos);
  EXPECT_NE(message([&] { s.write(t, host.data(), words * 4); }).find("inside an iteration"), std::string::npos);
  { auto op = s.op("fill", {}, {t}); }
  s.release(t);
  (void)s.end_iteration();
  EXPECT_NE(message([&] { s.write(t, host.data(), words * 4); }).find("a transient"), std::string::npos);
  words_t back(words);
  s.read(w, back.data(), words * 4);
  EXPECT_EQ(back, w0) << "a refused write changed the tensor";
}

}  // namespace
