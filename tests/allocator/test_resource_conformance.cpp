// One conformance suite for every device memory resource: the upstream device resource
// and the arena, on both backends (cuda instances skip without a GPU).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "allocator/arena_allocator.hpp"
#include "allocator/device_resource.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

/// A resource and whatever it stands on, owned together.
struct resource_stack {
  std::vector<std::unique_ptr<device_memory_resource>> layers;  // bottom first
  device_memory_resource& top() { return *layers.back(); }
};

struct resource_kind {
  const char* name;
  const char* backend;
  std::function<void(Device&, resource_stack&)> build;
};

template <class R, class... A>
void push(resource_stack& st, A&&... args) {
  st.layers.push_back(std::make_unique<R>(std::forward<A>(args)...));
}

const auto device_layer = [](Device& d, resource_stack& st) { push<device_resource>(st, d); };
const auto arena_layer = [](Device& d, resource_stack& st) {
  push<device_resource>(st, d);
  push<arena_allocator>(st, d, st.top(), device_budget(200_MiB));
};

std::vector<resource_kind> kinds() {
  std::vector<resource_kind> out;
  for (const char* b : {"cpu", "cuda"}) {
    out.push_back({"device", b, device_layer});
    out.push_back({"arena", b, arena_layer});
  }
  return out;
}

}  // namespace

class ResourceConformance : public ::testing::TestWithParam<resource_kind> {
 protected:
  void SetUp() override {
    if (std::string(GetParam().backend) == "cuda" && !cuda_available()) GTEST_SKIP() << "no GPU answers";
    device_options o;
    o.cpu_device_memory = 256_MiB;
    dev_ = make_device(GetParam().backend, o);
    s1_ = std::make_unique<owned_stream>(*dev_);
    s2_ = std::make_unique<owned_stream>(*dev_);
    GetParam().build(*dev_, stack_);
  }
  void TearDown() override {
    while (!stack_.layers.empty()) stack_.layers.pop_back();  // top first
  }
  device_memory_resource& mr() { return stack_.top(); }

  std::unique_ptr<Device> dev_;
  std::unique_ptr<owned_stream> s1_, s2_;  // outlive the resources (the stream contract)
  resource_stack stack_;
};

TEST_P(ResourceConformance, AllocationsAreAlignedDistinctAndHoldData) {
  stream s = *s1_;
  std::mt19937 rng(spillway::test::test_seed(3));
  std::map<std::uintptr_t, std::size_t> live;
  std::vector<std::pair<void*, std::size_t>> ptrs;
  for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{4096}, std::size_t{1_MiB - 1},
                        std::size_t{1_MiB + 1}, std::size_t{3_MiB + 17}, std::size_t{12_MiB}}) {
    void* p = mr().allocate(n, s);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % device_memory_alignment, 0u);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto next = live.lower_bound(a);
    if (next != live.end()) {
      EXPECT_LE(a + n, next->first);
    }
    if (next != live.begin()) {
      EXPECT_LE(std::prev(next)->first + std::prev(next)->second, a);
    }
    live.emplace(a, n);
    ptrs.emplace_back(p, n);
    std::vector<unsigned char> in(n), out(n);
    for (auto& b : in) b = static_cast<unsigned char>(rng());
    dev_->copy_async(p, in.data(), n, copy_kind::host_to_device, s);
    dev_->copy_async(out.data(), p, n, copy_kind::device_to_host, s);
    dev_->synchronize_stream(s);
    EXPECT_EQ(in, out) << "size " << n;
  }
  for (auto [p, n] : ptrs) mr().deallocate(p, n, s);
}

TEST_P(ResourceConformance, ZeroAndAbsurdSizesAreClearErrors) {
  try {
    (void)mr().allocate(0, *s1_);
    FAIL() << "0 bytes accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("0 bytes"), std::string::npos) << e.what();
  }
  try {
    (void)mr().allocate(max_size_bytes + 1, *s1_);
    FAIL() << "a size past max_size_bytes accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(max_size_bytes + 1)), std::string::npos) << e.what();
  }
  const std::size_t past_device = dev_->properties().total_memory + 1;
  try {
    (void)mr().allocate(past_device, *s1_);
    FAIL() << "a size past the device accepted";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find(format_bytes(past_device)), std::string::npos) << e.what();
  }
  mr().deallocate(nullptr, 0, *s1_);  // a no-op
  void* p = mr().allocate(1_MiB, *s1_);  // and the resource still works
  mr().deallocate(p, 1_MiB, *s1_);
}

TEST_P(ResourceConformance, FreedOnAnotherStreamThanAllocated) {
  void* p = mr().allocate(64_KiB, *s1_);
  dev_->memset_async(p, 1, 64_KiB, *s1_);
  owned_event e(*dev_);
  dev_->record_event(e, *s1_);
  dev_->stream_wait_event(*s2_, e);
  dev_->memset_async(p, 2, 64_KiB, *s2_);
  mr().deallocate(p, 64_KiB, *s2_);  // s2 is the stream of last use
  void* q = mr().allocate(64_KiB, *s1_);
  std::vector<unsigned char> out(64_KiB);
  dev_->memset_async(q, 3, 64_KiB, *s1_);
  dev_->copy_async(out.data(), q, 64_KiB, copy_kind::device_to_host, *s1_);
  dev_->synchronize();
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[64_KiB - 1], 3);
  mr().deallocate(q, 64_KiB, *s1_);
}

TEST_P(ResourceConformance, ManyThreadsAllocateAndFreeConcurrently) {
  constexpr int threads = 4;
  std::vector<std::thread> ts;
  std::atomic<int> finished{0};
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      owned_stream s(*dev_);
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 300; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const std::size_t n = 1 + rng() % 2_MiB;
          mine.emplace_back(mr().allocate(n, s), n);
        } else {
          const auto k = rng() % mine.size();
          mr().deallocate(mine[k].first, mine[k].second, s);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (auto [p, n] : mine) mr().deallocate(p, n, s);
      dev_->synchronize_stream(s);
      // The stream dies with this thread: the arena must stop using it first.
      for (auto& layer : stack_.layers)
        if (auto* arena = dynamic_cast<arena_allocator*>(layer.get())) arena->forget_stream(s);
      ++finished;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(finished.load(), threads);
}

INSTANTIATE_TEST_SUITE_P(Resources, ResourceConformance, ::testing::ValuesIn(kinds()), [](const auto& info) {
  return std::string(info.param.name) + "_" + info.param.backend;
});
