// The cpu backend's debug mode for host access to device memory (device_options::debug_host_access,
// Note [Debug host access]): a host thread that touches device memory while no stream work runs
// dies with a line naming the address; stream work of every kind still runs and gets the bytes
// right; with the mode off nothing changes.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

device_options debug_options(std::size_t capacity = 64_MiB) {
  device_options o;
  o.cpu_device_memory = capacity;
  o.debug_host_access = true;
  return o;
}

// What the fault handler writes, as a death test's regular expression.
constexpr const char* fault_line =
    "spillway: host code touched device memory at 0x[0-9a-f]+ outside a kernel or op\\.run "
    "\\(cpu_debug_host_access\\)";

// Death tests run in a child that starts the test binary again (threadsafe): the device's
// threads are not forked half-way through their work. They need no skip under the sanitizers:
// ASan (+UBSan) and TSan let a program install its own SIGSEGV handler, chain theirs behind it,
// and these tests pass under both (checked by building this file with -fsanitize=address,undefined
// and with -fsanitize=thread).
class CpuDebugAccessDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Reads a byte the way a ported C loop would: plainly, from the calling thread.
int host_read(const void* p) { return *static_cast<const volatile unsigned char*>(p); }
void host_write(void* p, unsigned char v) { *static_cast<volatile unsigned char*>(p) = v; }

}  // namespace

TEST_F(CpuDebugAccessDeathTest, HostReadOfDeviceMemoryWhileTheStreamIsIdleDiesNamingTheMistake) {
  EXPECT_DEATH(
      {
        cpu_device dev(debug_options());
        owned_stream s(dev);
        auto* p = static_cast<unsigned char*>(dev.allocate(4096));
        dev.memset_async(p, 7, 4096, s);
        dev.synchronize_stream(s);
        std::exit(host_read(p + 100));  // a "host loop" over device memory after the op
      },
      fault_line);
}

TEST_F(CpuDebugAccessDeathTest, HostWriteOfDeviceMemoryDiesToo) {
  EXPECT_DEATH(
      {
        cpu_device dev(debug_options());
        auto* p = static_cast<unsigned char*>(dev.allocate(1_MiB));
        host_write(p + 512_KiB, 1);
        std::exit(0);
      },
      fault_line);
}

TEST_F(CpuDebugAccessDeathTest, FaultsOutsideTheArenaGoToTheHandlerThatWasThereBefore) {
  // A program's own SIGSEGV handler (a crash reporter) still sees the faults that are not ours.
  EXPECT_EXIT(
      {
        struct sigaction act {};
        act.sa_handler = [](int) {
          constexpr char msg[] = "the program's own handler\n";
          (void)::write(STDERR_FILENO, msg, sizeof msg - 1);
          ::_exit(3);
        };
        sigemptyset(&act.sa_mask);
        ::sigaction(SIGSEGV, &act, nullptr);
        cpu_device dev(debug_options());
        void* guard_page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        std::exit(host_read(guard_page));
      },
      ::testing::ExitedWithCode(3), "the program's own handler");
}

TEST(CpuDebugAccess, IsOffByDefaultAndThenDeviceMemoryIsPlainHostMemory) {
  cpu_device dev(device_options{});
  EXPECT_FALSE(dev.debug_host_access());
  owned_stream s(dev);
  auto* p = static_cast<unsigned char*>(dev.allocate(4096));
  dev.memset_async(p, 9, 4096, s);
  dev.synchronize_stream(s);
  EXPECT_EQ(host_read(p + 4095), 9);  // a race on a GPU's terms, but not a fault here
  host_write(p, 1);
  EXPECT_EQ(host_read(p), 1);
  dev.deallocate(p, 4096);
}

TEST(CpuDebugAccess, KernelsMemsetsAndHostFunctionsRunWithAccess) {
  cpu_device dev(debug_options());
  ASSERT_TRUE(dev.debug_host_access());
  owned_stream s(dev);
  constexpr std::size_t n = 1 << 16;
  auto* d = static_cast<std::uint32_t*>(dev.allocate(n * sizeof(std::uint32_t)));
  dev.memset_async(d, 0, n * sizeof(std::uint32_t), s);
  dev.launch_kernel(s, [d] {
    for (std::size_t i = 0; i < n; ++i) d[i] += static_cast<std::uint32_t>(i);
  });
  // What the Session's op.run does: host code on device memory as a host function, then wait.
  std::uint64_t sum = 0;
  dev.launch_host(s, [d, &sum] {
    for (std::size_t i = 0; i < n; ++i) {
      sum += d[i];
      d[i] *= 2;
    }
  });
  dev.synchronize_stream(s);
  EXPECT_EQ(sum, std::uint64_t{n} * (n - 1) / 2);
  std::vector<std::uint32_t> back(n);
  dev.copy_async(back.data(), d, n * sizeof(std::uint32_t), copy_kind::device_to_host, s);  // pageable: synchronous
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 2 * i) << i;
  dev.deallocate(d, n * sizeof(std::uint32_t));
}

TEST(CpuDebugAccess, EveryCopyKindGetsTheBytesRightFromPinnedAndPageableMemory) {
  cpu_device dev(debug_options());
  owned_stream s(dev);
  constexpr std::size_t bytes = 3_MiB + 100;  // not a whole number of pages
  std::vector<unsigned char> src(bytes);
  for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  auto* pinned_in = static_cast<unsigned char*>(dev.allocate_pinned(bytes));
  auto* pinned_out = static_cast<unsigned char*>(dev.allocate_pinned(bytes));
  std::memcpy(pinned_in, src.data(), bytes);
  auto* a = dev.allocate(bytes);
  auto* b = dev.allocate(bytes);
  for (bool pinned : {true, false}) {
    SCOPED_TRACE(pinned ? "pinned" : "pageable");
    std::vector<unsigned char> pageable_out(bytes, 0);
    unsigned char* in = pinned ? pinned_in : src.data();
    unsigned char* out = pinned ? pinned_out : pageable_out.data();
    std::memset(out, 0, bytes);
    dev.memset_async(a, 0, bytes, s);
    dev.memset_async(b, 0, bytes, s);
    dev.copy_async(a, in, bytes, copy_kind::host_to_device, s);
    dev.copy_async(b, a, bytes, copy_kind::device_to_device, s);
    dev.copy_async(out, b, bytes, copy_kind::device_to_host, s);
    dev.synchronize_stream(s);
    ASSERT_EQ(std::memcmp(out, src.data(), bytes), 0);
    std::vector<unsigned char> h2h(bytes, 0);
    dev.copy_async(pinned ? pinned_out : h2h.data(), in, bytes, copy_kind::host_to_host, s);
    dev.synchronize_stream(s);
    ASSERT_EQ(std::memcmp(pinned ? pinned_out : h2h.data(), src.data(), bytes), 0);
  }
  EXPECT_EQ(dev.counters().synchronous_copies, 3u);  // the pageable round (H2D, D2H, H2H), as without the mode
  dev.deallocate(a, bytes);
  dev.deallocate(b, bytes);
  dev.deallocate_pinned(pinned_in, bytes);
  dev.deallocate_pinned(pinned_out, bytes);
}

TEST(CpuDebugAccess, WorkOnManyStreamsAtOnceComposes) {
  // Workers open and close the arena as they please; none may close it under another.
  cpu_device dev(debug_options());
  constexpr int streams = 4;
  constexpr int rounds = 200;
  constexpr std::size_t n = 4096;
  std::vector<owned_stream> ss;
  std::vector<std::uint64_t*> data;
  for (int i = 0; i < streams; ++i) {
    ss.emplace_back(dev);
    data.push_back(static_cast<std::uint64_t*>(dev.allocate(n * sizeof(std::uint64_t))));
    dev.memset_async(data.back(), 0, n * sizeof(std::uint64_t), ss.back());
  }
  std::atomic<std::uint64_t> host_seen{0};
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < streams; ++i) {
      auto* d = data[i];
      dev.launch_kernel(ss[i], [d] {
        for (std::size_t k = 0; k < n; ++k) d[k] += k;
      });
      if (r % 50 == 0) dev.launch_host(ss[i], [d, &host_seen] { host_seen += d[n - 1]; });
    }
  }
  dev.synchronize();
  EXPECT_GT(host_seen.load(), 0u);
  for (int i = 0; i < streams; ++i) {
    std::vector<std::uint64_t> back(n);
    dev.copy_async(back.data(), data[i], n * sizeof(std::uint64_t), copy_kind::device_to_host, ss[i]);
    for (std::size_t k = 0; k < n; ++k) ASSERT_EQ(back[k], k * rounds) << i << " " << k;
    dev.deallocate(data[i], n * sizeof(std::uint64_t));
  }
}

TEST(CpuDebugAccess, CapacityAlignmentAndReuseAreAsWithoutTheMode) {
  device_options o = debug_options(1_MiB);
  cpu_device dev(o);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(dev.allocate(256_KiB - 10));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(blocks.back()) % 256, 0u);
  }
  EXPECT_EQ(dev.used_memory(), 1_MiB);
  EXPECT_THROW((void)dev.allocate(1), out_of_memory);
  dev.deallocate(blocks[1], 256_KiB);
  dev.deallocate(blocks[2], 256_KiB);
  EXPECT_EQ(dev.free_memory(), 512_KiB);
  void* big = dev.allocate(512_KiB);  // the two freed neighbours, coalesced or not
  EXPECT_EQ(dev.free_memory(), 0u);
  // Many rounds of odd sizes never fail while the capacity allows them.
  dev.deallocate(big, 512_KiB);
  owned_stream s(dev);
  for (int round = 0; round < 1000; ++round) {
    const std::size_t bytes = 256 * static_cast<std::size_t>(1 + (round * 37) % 2000);
    void* p = dev.allocate(bytes);
    dev.memset_async(p, round & 0xff, bytes, s);
    dev.deallocate(p, bytes);
  }
  dev.deallocate(blocks[0], 256_KiB);
  dev.deallocate(blocks[3], 256_KiB);
  EXPECT_EQ(dev.used_memory(), 0u);
}

TEST(CpuDebugAccess, DevicesComeAndGoAndEachKeepsItsOwnArena) {
  for (int i = 0; i < 8; ++i) {
    cpu_device a(debug_options(8_MiB));
    cpu_device b(debug_options(8_MiB));
    owned_stream sa(a);
    owned_stream sb(b);
    auto* pa = static_cast<unsigned char*>(a.allocate(4096));
    auto* pb = static_cast<unsigned char*>(b.allocate(4096));
    a.memset_async(pa, 1, 4096, sa);
    b.memset_async(pb, 2, 4096, sb);
    unsigned char ha = 0;
    unsigned char hb = 0;
    a.copy_async(&ha, pa + 4095, 1, copy_kind::device_to_host, sa);
    b.copy_async(&hb, pb + 4095, 1, copy_kind::device_to_host, sb);
    EXPECT_EQ(ha, 1);
    EXPECT_EQ(hb, 2);
  }
}
