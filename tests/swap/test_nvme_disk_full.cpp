// A real file system filling up (a 4 MiB tmpfs mounted for the test; it needs root and skips
// without it): space the tier cannot reserve is an error naming the directory before any
// tensor is written, growing on demand stops with such an error and keeps what was stored, and
// space reserved up front stays usable when something else fills the disk. And a file that
// cannot grow for another reason (a file size limit, no root needed) gives back what the write
// had taken.
#include <gtest/gtest.h>

#include <sys/mount.h>
#include <sys/resource.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "swap/nvme_tier.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

/// A tmpfs of `bytes` mounted on a fresh temporary directory, unmounted at the end.
class small_disk {
 public:
  explicit small_disk(std::uint64_t bytes) {
    const std::string opts = "size=" + std::to_string(bytes);
    mounted_ = ::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, opts.c_str()) == 0;
  }
  ~small_disk() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  small_disk(const small_disk&) = delete;
  small_disk& operator=(const small_disk&) = delete;
  [[nodiscard]] bool mounted() const { return mounted_; }
  [[nodiscard]] const std::string& path() const { return dir_.path(); }
  [[nodiscard]] std::size_t files() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path())) ++n;
    return n;
  }

 private:
  test::temp_dir dir_;
  bool mounted_ = false;
};

nvme_options on(const small_disk& d, std::uint64_t reserve, bool grow) {
  nvme_options o;
  o.directories = {d.path()};
  o.reserve = reserve;
  o.grow_on_demand = grow;
  o.block_size = 256_KiB;
  o.queue_depth = 8;
  return o;
}

#define NEED_SMALL_DISK(d) \
  if (!(d).mounted()) GTEST_SKIP() << "mounting a 4 MiB tmpfs needs root (CAP_SYS_ADMIN)"

}  // namespace

TEST(NvmeDiskFull, AReserveTheFileSystemCannotHoldIsRefusedNamingTheDirectoryAndLeavesNoFile) {
  small_disk d(4_MiB);
  NEED_SMALL_DISK(d);
  try {
    nvme_tier t(on(d, 8_MiB, false));
    FAIL() << "8 MiB reserved on a 4 MiB file system";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find(d.path()), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.files(), 0u) << "a refused tier left its swap file behind";
}

TEST(NvmeDiskFull, GrowingOnDemandStopsWithAnErrorNamingTheDirectoryAndKeepsWhatWasStored) {
  small_disk d(4_MiB);
  NEED_SMALL_DISK(d);
  {
    nvme_tier t(on(d, 1_MiB, true));
    std::vector<std::vector<unsigned char>> stored;
    std::string failure;
    for (int i = 0; i < 8 && failure.empty(); ++i) {
      auto bytes = test::random_bytes(1_MiB, 10 + i);
      try {
        t.write("t" + std::to_string(i), bytes.data(), bytes.size()).wait();
        stored.push_back(std::move(bytes));
      } catch (const error& e) {
        failure = e.what();
      }
    }
    ASSERT_FALSE(failure.empty()) << "8 MiB of tensors fit on a 4 MiB file system";
    EXPECT_NE(failure.find(d.path()), std::string::npos) << failure;
    EXPECT_NE(failure.find("t" + std::to_string(stored.size())), std::string::npos) << "names the tensor: " << failure;
    EXPECT_EQ(failure.find("checksum"), std::string::npos) << failure;
    EXPECT_NE(failure.find("no room to grow it"), std::string::npos) << "says the disk, not a setting, is short: " << failure;
    EXPECT_EQ(failure.find("or grow_on_demand"), std::string::npos) << "it grows on demand already: " << failure;
    ASSERT_GE(stored.size(), 2u) << "the disk held less than expected";
    for (std::size_t i = 0; i < stored.size(); ++i) {
      std::vector<unsigned char> back(stored[i].size());
      t.read("t" + std::to_string(i), back.data()).wait();
      EXPECT_EQ(back, stored[i]) << "tensor " << i << " stored before the disk filled";
    }
  }
  EXPECT_EQ(d.files(), 0u) << "the tier left its swap file behind";
}

TEST(NvmeDiskFull, SpaceReservedUpFrontStaysUsableWhenSomethingElseFillsTheDisk) {
  small_disk d(4_MiB);
  NEED_SMALL_DISK(d);
  {
    nvme_tier t(on(d, 2_MiB, false));
    {  // another program takes every byte left
      std::ofstream hog(d.path() + "/hog", std::ios::binary);
      const std::vector<char> chunk(64 * 1024, 'x');
      for (int i = 0; i < 64 && hog.write(chunk.data(), static_cast<std::streamsize>(chunk.size())); ++i) {
      }
    }
    const auto bytes = test::random_bytes(2_MiB - 4096, 5);
    t.write("w", bytes.data(), bytes.size()).wait();
    std::vector<unsigned char> back(bytes.size());
    t.read("w", back.data()).wait();
    EXPECT_EQ(back, bytes);
  }
  std::filesystem::remove(d.path() + "/hog");
  EXPECT_EQ(d.files(), 0u);
}

// A swap file that cannot grow for another reason than space (here the process's file size
// limit: fallocate fails with EFBIG) fails the write with that error, and the blocks the write
// had already taken in the other files go back: the tier's free space is as before, and a
// tensor that fits is stored and read back whole.
TEST(NvmeDiskFull, AGrowthThatFailsOtherwiseGivesBackTheBlocksTheWriteHadTaken) {
  test::temp_dir a, b;
  nvme_options o;
  o.directories = {a.path(), b.path()};
  o.reserve = 2_MiB;  // 1 MiB, four blocks, per file
  o.grow_on_demand = true;
  o.block_size = 256_KiB;
  o.queue_depth = 8;
  nvme_tier t(o);
  // One block in each file, then the one in file 0 erased: file 0 has four blocks free, file 1
  // three. An eight-block tensor starting at file 1 takes four in file 0, then must grow file 1.
  const auto one = test::random_bytes(256_KiB, 1);
  t.write("x0", one.data(), one.size()).wait();
  t.write("x1", one.data(), one.size()).wait();
  t.write("x2", one.data(), one.size()).wait();
  t.erase("x0");
  t.erase("x2");
  const auto before = t.stats();
  ASSERT_EQ(before.free_bytes_per_file, (std::vector<std::uint64_t>{1_MiB, 768_KiB}));
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // the kernel signals a file past the limit
  rlimit low = old;
  low.rlim_cur = 1_MiB + 64_KiB;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &low), 0);
  const auto big = test::random_bytes(2_MiB, 2);
  std::string failure;
  try {
    t.write("big", big.data(), big.size()).wait();
  } catch (const error& e) {
    failure = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(failure.empty()) << "the files grew past the process's file size limit";
  EXPECT_FALSE(t.contains("big"));
  EXPECT_EQ(t.stats().free_bytes, before.free_bytes) << "blocks of the failed write stayed taken: " << failure;
  t.write("big", big.data(), big.size()).wait();  // the limit lifted, it grows and stores it
  std::vector<unsigned char> back(big.size());
  t.read("big", back.data()).wait();
  EXPECT_EQ(back, big);
}

