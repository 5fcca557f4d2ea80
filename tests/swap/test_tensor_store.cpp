// tensor_store on the cpu backend: every path (device<->host, host<->nvme, device<->nvme)
// round trips bytes of many sizes; stream_wait chains later work after a move; a failed move
// leaves the tensor where it was, readable, and names it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "swap/tensor_store.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;
using action = test::fault_plan::action;

namespace {

struct store_fixture {
  test::temp_dir dir;
  cpu_device dev{[] {
    device_options o;
    o.cpu_device_memory = 256_MiB;
    return o;
  }()};
  pinned_host_pool pool{dev, {.capacity = 0, .region_size = 64_MiB, .alignment = 4096}};
  host_tier host{pool, 256_MiB};
  std::shared_ptr<test::fault_plan> plan = std::make_shared<test::fault_plan>();
  nvme_tier nvme;
  tensor_store store{dev, host, &nvme};
  owned_stream s{dev};

  static nvme_options nvme_opts(const std::string& d, std::shared_ptr<test::fault_plan> p) {
    nvme_options o;
    o.directories = {d};
    o.capacity = 192_MiB;
    o.make_queue = test::faulty(std::move(p));
    return o;
  }
  store_fixture() : nvme(nvme_opts(dir.path(), plan), &pool) {}

  // Puts `data` on the device as tensor `name` and returns the device pointer.
  void* put_on_device(const std::string& name, const std::vector<unsigned char>& data) {
    void* d = dev.allocate(std::max<std::size_t>(data.size(), 1));
    dev.copy_async(d, data.data(), data.size(), copy_kind::host_to_device, s);
    dev.synchronize_stream(s);
    store.add_on_device(name, data.size(), d);
    return d;
  }
  std::vector<unsigned char> read_device(const void* d, std::size_t n) {
    std::vector<unsigned char> out(n);
    dev.copy_async(out.data(), d, n, copy_kind::device_to_host, s);
    dev.synchronize_stream(s);
    return out;
  }
  std::vector<unsigned char> read_host(const std::string& name) {
    const auto* p = static_cast<const unsigned char*>(store.host_ptr(name));
    return {p, p + store.bytes(name)};
  }
};

bool names(const std::exception& e, const std::string& tensor) {
  return std::string(e.what()).find("'" + tensor + "'") != std::string::npos;
}

}  // namespace

TEST(TensorStore, EveryPathRoundTripsManySizes) {
  store_fixture f;
  std::uint64_t seed = 1;
  for (std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{1_MiB + 1}, std::size_t{3_MiB + 333},
                        std::size_t{64_MiB}}) {
    const auto data = test::random_bytes(n, seed++);
    const std::string name = "t" + std::to_string(n);
    void* d = f.put_on_device(name, data);
    // device -> host -> nvme -> host -> device
    f.store.to_host(name, f.s).wait();
    EXPECT_EQ(f.store.where(name), tier::host);
    ASSERT_EQ(f.read_host(name), data) << "device->host " << n;
    f.store.to_nvme(name, f.s).wait();
    EXPECT_EQ(f.store.where(name), tier::nvme);
    f.store.to_host(name, f.s).wait();
    ASSERT_EQ(f.read_host(name), data) << "nvme->host " << n;
    EXPECT_FALSE(f.nvme.contains(name)) << "the NVMe copy was not released";
    f.dev.memset_async(d, 0, n, f.s);
    f.store.to_device(name, d, f.s).wait();
    EXPECT_EQ(f.store.where(name), tier::device);
    ASSERT_EQ(f.read_device(d, n), data) << "host->device " << n;
    // device -> nvme -> device, through staging
    f.store.to_nvme(name, f.s).wait();
    EXPECT_EQ(f.store.where(name), tier::nvme);
    f.dev.memset_async(d, 0, n, f.s);
    f.store.to_device(name, d, f.s).wait();
    ASSERT_EQ(f.read_device(d, n), data) << "nvme->device " << n;
    f.store.remove(name);
    f.dev.deallocate(d, n);
  }
  EXPECT_EQ(f.host.stats().used_bytes, 0u) << "a host or staging block leaked";
  EXPECT_EQ(f.nvme.stats().stored_bytes, 0u);
}

TEST(TensorStore, AMoveToWhereTheTensorIsIsReadyAtOnce) {
  store_fixture f;
  auto* p = static_cast<unsigned char*>(f.store.add_on_host("h", 100));
  std::memset(p, 3, 100);
  auto h = f.store.to_host("h", f.s);
  EXPECT_TRUE(h.ready());
  h.wait();
}

TEST(TensorStore, StreamWaitOrdersLaterDeviceWorkAfterTheMove) {
  store_fixture f;
  const auto data = test::random_bytes(6_MiB + 7, 3);
  void* d = f.put_on_device("w", data);
  f.store.to_nvme("w", f.s).wait();
  void* dst = f.dev.allocate(data.size());
  owned_stream compute(f.dev);
  auto h = f.store.to_device("w", dst, f.s);
  EXPECT_NE(h.device_event().handle, nullptr);
  h.stream_wait(f.dev, compute);  // compute waits on a device event, not on the host
  std::vector<unsigned char> out(data.size());
  f.dev.copy_async(out.data(), dst, data.size(), copy_kind::device_to_host, compute);
  f.dev.synchronize_stream(compute);
  EXPECT_EQ(out, data);
  h.wait();
  // A move that ends in file I/O has no device event: the caller's thread waits for it, and
  // no host function is left on the stream to wait (they share one callback thread).
  auto back = f.store.to_nvme("w", f.s);
  EXPECT_EQ(back.device_event().handle, nullptr);
  const auto before = f.dev.counters().host_functions;
  back.stream_wait(f.dev, compute);
  EXPECT_TRUE(back.ready());
  EXPECT_TRUE(f.nvme.contains("w"));
  f.dev.synchronize_stream(compute);
  EXPECT_EQ(f.dev.counters().host_functions, before);
  f.dev.deallocate(d, data.size());
  f.dev.deallocate(dst, data.size());
}

TEST(TensorStore, FailedWriteToNvmeLeavesTheTensorOnTheHostReadable) {
  store_fixture f;
  const auto data = test::random_bytes(3_MiB, 4);
  std::memcpy(f.store.add_on_host("h", data.size()), data.data(), data.size());
  f.plan->kind = io_kind::write;
  f.plan->what = action::fail;
  f.plan->first = 2;
  try {
    f.store.to_nvme("h", f.s).wait();
    FAIL() << "no error";
  } catch (const io_error& e) {
    EXPECT_TRUE(names(e, "h")) << e.what();
  }
  f.plan->disarm();
  EXPECT_EQ(f.store.where("h"), tier::host);
  EXPECT_FALSE(f.store.moving("h"));
  EXPECT_EQ(f.read_host("h"), data);
  f.store.to_nvme("h", f.s).wait();  // works again once the drive does
  EXPECT_EQ(f.store.where("h"), tier::nvme);
}

TEST(TensorStore, FailedWriteFromTheDeviceLeavesTheTensorOnTheDevice) {
  store_fixture f;
  const auto data = test::random_bytes(2_MiB + 9, 5);
  void* d = f.put_on_device("dv", data);
  f.plan->kind = io_kind::write;
  f.plan->what = action::fail;
  f.plan->error = ENOSPC;
  f.plan->first = 1;
  auto h = f.store.to_nvme("dv", f.s);
  EXPECT_THROW(h.wait(), io_error);
  f.plan->disarm();
  EXPECT_EQ(f.store.where("dv"), tier::device);
  EXPECT_EQ(f.store.device_ptr("dv"), d);
  EXPECT_EQ(f.read_device(d, data.size()), data);
  EXPECT_EQ(f.host.stats().used_bytes, 0u) << "the staging block leaked";
  f.store.remove("dv");
  f.dev.deallocate(d, data.size());
}

TEST(TensorStore, CorruptedNvmeCopyIsReportedAndStaysOnNvme) {
  store_fixture f;
  const auto data = test::random_bytes(2_MiB, 6);
  std::memcpy(f.store.add_on_host("c", data.size()), data.data(), data.size());
  f.plan->kind = io_kind::write;
  f.plan->what = action::corrupt_on_disk;
  f.plan->first = 1;
  f.store.to_nvme("c", f.s).wait();
  f.plan->disarm();
  void* d = f.dev.allocate(data.size());
  try {
    f.store.to_device("c", d, f.s).wait();
    FAIL() << "corruption not reported";
  } catch (const corruption_error& e) {
    EXPECT_TRUE(names(e, "c")) << e.what();
  }
  EXPECT_EQ(f.store.where("c"), tier::nvme);
  EXPECT_THROW(f.store.to_host("c", f.s).wait(), corruption_error);
  EXPECT_EQ(f.store.where("c"), tier::nvme);
  EXPECT_EQ(f.host.stats().used_bytes, 0u);
  f.dev.deallocate(d, data.size());
}

TEST(TensorStore, HostTierFullIsOutOfMemoryAndTheTensorStaysOnTheDevice) {
  test::temp_dir dir;
  cpu_device dev;
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 8_MiB, .alignment = 4096});
  host_tier host(pool, 1_MiB);
  tensor_store store(dev, host);
  owned_stream s(dev);
  void* d = dev.allocate(2_MiB);
  store.add_on_device("big", 2_MiB, d);
  try {
    (void)store.to_host("big", s);
    FAIL() << "no error";
  } catch (const out_of_memory& e) {
    EXPECT_TRUE(names(e, "big")) << e.what();
  }
  EXPECT_EQ(store.where("big"), tier::device);
  EXPECT_FALSE(store.moving("big"));
  EXPECT_THROW((void)store.to_nvme("big", s), config_error);  // no NVMe tier
  dev.deallocate(d, 2_MiB);
}

TEST(TensorStore, MisuseIsAClearError) {
  store_fixture f;
  EXPECT_THROW((void)f.store.where("none"), error);
  (void)f.store.add_on_host("x", 10);
  EXPECT_THROW((void)f.store.add_on_host("x", 10), error);
  auto h = f.store.to_nvme("x", f.s);
  h.wait();
  EXPECT_EQ(f.store.host_ptr("x"), nullptr);
}
