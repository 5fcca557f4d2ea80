// Swap file setup: an unnamed 0600 file with its space reserved; clear errors for a directory
// that is missing, not a directory, not writable or too small; buffered fallback with a
// warning where O_DIRECT is refused; /dev/shm as a file system that may lack O_DIRECT.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "device/error.hpp"
#include "device/log.hpp"
#include "device/units.hpp"
#include "swap/swap_file.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs `fn` on a thread of its own that has given up CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
// (capabilities are per thread on Linux), so file permissions bind it even when the tests run
// as root. Returns false when the capabilities could not be dropped.
template <class F>
bool without_dac_override(F fn) {
  bool dropped = false;
  std::thread t([&] {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    if (::syscall(SYS_capget, &hdr, data) != 0) return;
    for (int cap : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH}) {
      data[cap / 32].effective &= ~(1u << (cap % 32));
      data[cap / 32].permitted &= ~(1u << (cap % 32));
    }
    if (::syscall(SYS_capset, &hdr, data) != 0) return;
    dropped = true;
    fn();
  });
  t.join();
  return dropped;
}

struct captured_log {
  std::mutex m;
  std::vector<std::string> warnings;
  log_sink previous;
  captured_log() {
    previous = set_log_sink([this](log_level l, const std::string& msg) {
      std::lock_guard lock(m);
      if (l == log_level::warning) warnings.push_back(msg);
    });
  }
  ~captured_log() { set_log_sink(previous); }
};

}  // namespace

TEST(SwapFile, IsUnnamedMode0600AndReserved) {
  test::temp_dir dir;
  auto f = open_swap_file(dir.path(), 8_MiB);
  ASSERT_GE(f.fd(), 0);
  struct stat st {};
  ASSERT_EQ(::fstat(f.fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), 8_MiB);
  EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, 8_MiB) << "space not reserved";
  EXPECT_EQ(st.st_nlink, 0u) << "the swap file has a name";
  EXPECT_TRUE(dir.empty());
  EXPECT_TRUE(f.direct()) << "/tmp is a disk file system here; O_DIRECT expected";
  EXPECT_GE(f.alignment(), 512u);
  EXPECT_EQ(f.alignment() & (f.alignment() - 1), 0u);
}

TEST(SwapFile, MissingDirectoryIsAConfigErrorNamingIt) {
  test::temp_dir dir;
  const std::string missing = dir.path() + "/no-such-dir";
  try {
    (void)open_swap_file(missing, 1_MiB);
    FAIL() << "no error";
  } catch (const config_error& e) {
    EXPECT_TRUE(contains(e.what(), missing)) << e.what();
  }
}

TEST(SwapFile, PathThroughARegularFileIsAConfigError) {
  test::temp_dir dir;
  const std::string file = dir.path() + "/plain";
  std::ofstream(file) << "x";
  EXPECT_THROW((void)open_swap_file(file, 1_MiB), config_error);
  EXPECT_THROW((void)open_swap_file(file + "/sub", 1_MiB), config_error);
}

TEST(SwapFile, NotWritableDirectoryIsAConfigErrorEvenForRoot) {
  test::temp_dir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0500), 0);
  std::string message;
  bool threw_config = false;
  const bool dropped = without_dac_override([&] {
    try {
      (void)open_swap_file(dir.path(), 1_MiB);
    } catch (const config_error& e) {
      threw_config = true;
      message = e.what();
    } catch (...) {
    }
  });
  if (!dropped) GTEST_SKIP() << "cannot drop CAP_DAC_OVERRIDE here";
  EXPECT_TRUE(threw_config);
  EXPECT_TRUE(contains(message, "not writable")) << message;
  EXPECT_TRUE(contains(message, dir.path())) << message;
}

TEST(SwapFile, TooLittleSpaceIsAnErrorBeforeAnythingIsWritten) {
  test::temp_dir dir;
  const std::uint64_t huge = 1ULL << 50;  // 1 PiB: more than any test machine has
  try {
    (void)open_swap_file(dir.path(), huge);
    FAIL() << "no error";
  } catch (const out_of_memory& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, dir.path())) << m;
    EXPECT_TRUE(contains(m, std::to_string(huge))) << m;
    EXPECT_TRUE(contains(m, "free")) << m;
  }
  EXPECT_TRUE(dir.empty()) << "a failed setup left a file behind";
}

TEST(SwapFile, FallsBackToBufferedIOWithAWarningWhereODirectIsRefused) {
  test::temp_dir dir;
  captured_log log;
  file_opener no_direct = [](const std::string& path, int flags, mode_t mode) {
    if ((flags & O_DIRECT) != 0) return -EINVAL;  // as tmpfs answers on older kernels
    const int fd = ::open(path.c_str(), flags, mode);
    return fd >= 0 ? fd : -errno;
  };
  auto f = open_swap_file(dir.path(), 1_MiB, no_direct);
  EXPECT_FALSE(f.direct());
  EXPECT_GE(f.fd(), 0);
  std::lock_guard lock(log.m);
  ASSERT_EQ(log.warnings.size(), 1u);
  EXPECT_TRUE(contains(log.warnings[0], "O_DIRECT")) << log.warnings[0];
}

TEST(SwapFile, WorksOnDevShmWithOrWithoutODirect) {
  if (::access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm";
  test::temp_dir dir("/dev/shm");
  captured_log log;
  auto f = open_swap_file(dir.path(), 1_MiB);
  EXPECT_GE(f.fd(), 0);
  std::lock_guard lock(log.m);
  EXPECT_EQ(log.warnings.empty(), f.direct());  // a warning exactly when it fell back
}

TEST(SwapFile, NamedFallbackWhenOTmpfileIsMissing) {
  test::temp_dir dir;
  file_opener no_tmpfile = [](const std::string& path, int flags, mode_t mode) {
    if ((flags & O_TMPFILE) == O_TMPFILE) return -EOPNOTSUPP;
    const int fd = ::open(path.c_str(), flags, mode);
    return fd >= 0 ? fd : -errno;
  };
  auto f = open_swap_file(dir.path(), 1_MiB, no_tmpfile);
  struct stat st {};
  ASSERT_EQ(::fstat(f.fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_TRUE(dir.empty()) << "the named swap file was not unlinked";
}
