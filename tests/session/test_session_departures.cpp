// Iterations that depart from the recorded trace partway: the plan is followed up to the op where
// the iteration changes, then the iteration finishes on demand. A plan may drop a value its trace
// never reads again (the next traced use overwrites it); an iteration that departs and reads it
// first must still find it, for parameters and optimizer state. Every value is integer
// arithmetic checked against a host model of the same loop, at every policy and a tight budget.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/swap_policy.hpp"
#include "watchdog.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr int tensors = 8;
constexpr std::size_t words = 4096;  // 16 KiB per tensor
constexpr std::uint64_t bytes = words * 4;

/// One op: reads `in` (one or two tensors), writes `out`; in place when `out` is also read.
struct op_spec {
  std::vector<int> in;
  int out = 0;
  std::uint32_t salt = 0;
};

using model = std::vector<std::vector<std::uint32_t>>;

/// What the op computes, on the host model and in the kernel alike.
void apply(const op_spec& op, const std::vector<const std::uint32_t*>& in, std::uint32_t* out) {
  for (std::size_t i = 0; i < words; ++i) {
    std::uint32_t v = op.salt + static_cast<std::uint32_t>(i);
    for (const auto* x : in) v = (v ^ x[i]) * 2654435761u + (x[i] >> 7);
    out[i] = v;
  }
}

op_spec random_op(std::mt19937& rng) {
  op_spec op;
  op.in.push_back(static_cast<int>(rng() % tensors));
  if (rng() % 2 == 0) {
    int b = static_cast<int>(rng() % tensors);
    if (b != op.in[0]) op.in.push_back(b);
  }
  // Half the ops update a tensor they read; the others overwrite one without reading it.
  if (rng() % 2 == 0) {
    op.out = op.in[rng() % op.in.size()];
  } else {
    do {
      op.out = static_cast<int>(rng() % tensors);
    } while (std::find(op.in.begin(), op.in.end(), op.out) != op.in.end());
  }
  op.salt = static_cast<std::uint32_t>(rng());
  return op;
}

session_config config_for(const std::string& policy, double ratio) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.link_gbps = 0;
  c.policy = policy;
  c.device_budget_ratio = ratio;
  return c;
}

/// Runs the iterations through a Session and returns every tensor's value after each iteration.
std::vector<model> run_session(const session_config& c, const std::vector<std::vector<op_spec>>& iterations,
                               const model& init) {
  Session s(c);
  std::vector<tensor_handle> t;
  for (int i = 0; i < tensors; ++i)
    t.push_back(s.add_persistent("t" + std::to_string(i), bytes,
                                 i % 2 == 0 ? tensor_kind::parameter : tensor_kind::optimizer_state, init[i].data()));
  std::vector<model> after;
  for (const auto& ops : iterations) {
    s.begin_iteration();
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const op_spec& o = ops[k];
      std::vector<tensor_handle> reads, writes{t[o.out]};
      for (int x : o.in) reads.push_back(t[x]);
      auto op = s.op("op" + std::to_string(k), reads, writes);
      std::vector<const std::uint32_t*> in;
      for (int x : o.in) in.push_back(op.ptr<std::uint32_t>(t[x]));
      op.device().launch_kernel(op.stream(), [o, in, out = op.ptr<std::uint32_t>(t[o.out])] { apply(o, in, out); });
    }
    (void)s.end_iteration();
    model m(tensors, std::vector<std::uint32_t>(words));
    for (int i = 0; i < tensors; ++i) s.read(t[i], m[i].data(), bytes);
    after.push_back(std::move(m));
  }
  return after;
}

std::vector<model> run_host(const std::vector<std::vector<op_spec>>& iterations, model m) {
  std::vector<model> after;
  for (const auto& ops : iterations) {
    for (const auto& o : ops) {
      std::vector<const std::uint32_t*> in;
      std::vector<std::vector<std::uint32_t>> copies;  // an in-place op reads the old value
      for (int x : o.in) copies.push_back(m[x]);
      for (const auto& c : copies) in.push_back(c.data());
      apply(o, in, m[o.out].data());
    }
    after.push_back(m);
  }
  return after;
}

// The trace: t1 is read, then overwritten three ops later, so under a tight budget a plan may
// free t1 after its read without copying it out. The next iteration departs right there and
// reads t1 first: it must see the value the first iteration left.
TEST(SessionDepartures, AParameterTheTraceOverwritesIsStillThereForAnIterationThatReadsItFirst) {
  spillway::testing::watchdog dog("AParameterTheTraceOverwrites", std::chrono::seconds(120));
  const std::vector<op_spec> recorded = {{{1}, 2, 11}, {{3}, 4, 12}, {{5}, 6, 13}, {{7}, 0, 14}, {{2}, 1, 15},
                                         {{1, 4}, 3, 16}};
  std::vector<op_spec> departing = recorded;
  departing[1] = {{1}, 5, 17};  // reads t1 where the trace had no use of it
  const std::vector<std::vector<op_spec>> iterations = {recorded, recorded, departing, recorded};
  model init(tensors, std::vector<std::uint32_t>(words));
  for (int i = 0; i < tensors; ++i)
    for (std::size_t w = 0; w < words; ++w) init[i][w] = static_cast<std::uint32_t>(w * 31 + i * 977 + 5);
  const auto want = run_host(iterations, init);
  for (const char* policy : {"lms", "vdnn", "auto", "checkpoint", "capuchin"}) {
    SCOPED_TRACE(policy);
    std::vector<model> got;
    ASSERT_NO_THROW(got = run_session(config_for(policy, 0.4), iterations, init));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << "after iteration " << i + 1;
  }
}

// Property: a recorded sequence of random ops, then iterations that follow it, change one op at a
// random place (a departure), or append one; the values after every iteration are the host's.
TEST(SessionDepartures, RandomDeparturesGiveTheHostValuesAtEveryPolicy) {
  spillway::testing::watchdog dog("RandomDepartures", std::chrono::seconds(240));
  std::mt19937 rng(20261204);
  const char* const policies[] = {"none", "lms", "vdnn", "auto", "checkpoint", "capuchin"};
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<op_spec> base;
    const int n = 8 + static_cast<int>(rng() % 9);
    for (int k = 0; k < n; ++k) base.push_back(random_op(rng));
    std::vector<std::vector<op_spec>> iterations = {base, base};
    for (int it = 0; it < 4; ++it) {
      std::vector<op_spec> ops = iterations.back();
      switch (rng() % 3) {
        case 0: break;  // follows the plan
        case 1: ops[rng() % ops.size()] = random_op(rng); break;
        default: ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(rng() % ops.size()), random_op(rng)); break;
      }
      iterations.push_back(ops);
    }
    model init(tensors, std::vector<std::uint32_t>(words));
    for (int i = 0; i < tensors; ++i)
      for (std::size_t w = 0; w < words; ++w) init[i][w] = static_cast<std::uint32_t>(rng());
    const auto want = run_host(iterations, init);
    const char* policy = policies[trial % std::size(policies)];
    const double ratio = trial % 4 < 2 ? 0.4 : 0.6;
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + policy + " at ratio " + std::to_string(ratio));
    std::vector<model> got;
    ASSERT_NO_THROW(got = run_session(config_for(policy, ratio), iterations, init));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << "after iteration " << i + 1;
  }
}

}  // namespace
