// Many tensors moving both ways at once, from several threads on several streams, through a
// tier with several rings; every byte compared at the end.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/units.hpp"
#include "swap/tensor_store.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;

TEST(SwapConcurrency, ManyTensorsMovingBothWaysOnSeveralStreams) {
  test::temp_dir a, b;
  cpu_device dev(device_options{.cpu_device_memory = 256_MiB});
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 32_MiB, .alignment = 4096});
  host_tier host(pool, 128_MiB);
  nvme_options o;
  o.directories = {a.path(), b.path()};
  o.capacity = 256_MiB;
  o.block_size = 256_KiB;
  o.queue_depth = 16;
  o.rings = 2;
  nvme_tier nvme(o, &pool);
  tensor_store store(dev, host, &nvme);

  constexpr int threads = 4;
  constexpr int per_thread = 6;
  constexpr int rounds = 3;
  std::vector<std::thread> workers;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      owned_stream s(dev);
      std::vector<std::string> names;
      std::vector<std::vector<unsigned char>> data;
      std::vector<void*> dptr;
      for (int i = 0; i < per_thread; ++i) {
        names.push_back("t" + std::to_string(t) + "_" + std::to_string(i));
        data.push_back(test::random_bytes(1 + (static_cast<std::size_t>(t * 7 + i * 13) % 5) * 700_KiB + i * 37, t * 100 + i));
        dptr.push_back(dev.allocate(data.back().size()));
        dev.copy_async(dptr.back(), data.back().data(), data.back().size(), copy_kind::host_to_device, s);
      }
      dev.synchronize_stream(s);
      for (int i = 0; i < per_thread; ++i) store.add_on_device(names[i], data[i].size(), dptr[i]);
      for (int r = 0; r < rounds; ++r) {
        std::vector<move_handle> out;
        for (int i = 0; i < per_thread; ++i)
          out.push_back(i % 2 == 0 ? store.to_nvme(names[i], s) : store.to_host(names[i], s));
        for (auto& h : out) h.wait();
        for (int i = 0; i < per_thread; ++i) dev.memset_async(dptr[i], 0, data[i].size(), s);
        std::vector<move_handle> in;
        for (int i = 0; i < per_thread; ++i)
          in.push_back(i % 3 == 0 ? store.to_host(names[i], s) : store.to_device(names[i], dptr[i], s));
        for (auto& h : in) h.wait();
        for (int i = 0; i < per_thread; ++i)
          if (store.where(names[i]) == tier::host) store.to_device(names[i], dptr[i], s).wait();
      }
      for (int i = 0; i < per_thread; ++i) {
        std::vector<unsigned char> back(data[i].size());
        dev.copy_async(back.data(), dptr[i], back.size(), copy_kind::device_to_host, s);
        dev.synchronize_stream(s);
        if (back != data[i]) failures.fetch_add(1);
        store.remove(names[i]);
        dev.deallocate(dptr[i], data[i].size());
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(host.stats().used_bytes, 0u);
  EXPECT_EQ(nvme.stats().stored_bytes, 0u);
  EXPECT_EQ(nvme.stats().failed_moves, 0u);
}

TEST(SwapConcurrency, TierReadsAndWritesFromManyThreadsAtOnce) {
  test::temp_dir dir;
  nvme_options o;
  o.directories = {dir.path()};
  o.capacity = 128_MiB;
  o.block_size = 128_KiB;
  o.rings = 3;
  o.queue_depth = 8;
  nvme_tier tier(o);
  std::vector<std::thread> workers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 6; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        const auto data = test::random_bytes(300_KiB * (i + 1) + t, t * 10 + i);
        const std::string name = "w" + std::to_string(t) + "_" + std::to_string(i);
        tier.write(name, data.data(), data.size()).wait();
        std::vector<unsigned char> back(data.size());
        tier.read(name, back.data()).wait();
        if (back != data) bad.fetch_add(1);
        tier.erase(name);
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(tier.stats().free_bytes, tier.stats().capacity_bytes);
}
