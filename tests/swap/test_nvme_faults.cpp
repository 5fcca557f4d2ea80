// Fault injection through the I/O seam: EIO on the k-th read or write, short transfers,
// -EAGAIN, ENOSPC, a block corrupted on disk. In every case the error names the tensor,
// nothing stored before is lost, and the tier keeps working for other tensors.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <map>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/units.hpp"
#include "swap/nvme_tier.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;
using action = test::fault_plan::action;

namespace {

struct faulty_tier {
  test::temp_dir dir;
  std::shared_ptr<test::fault_plan> plan = std::make_shared<test::fault_plan>();
  std::unique_ptr<nvme_tier> tier;
  std::vector<unsigned char> kept = test::random_bytes(2_MiB + 5, 77);

  explicit faulty_tier(unsigned rings = 1) {
    nvme_options o;
    o.directories = {dir.path()};
    o.reserve = 32_MiB;
    o.block_size = 256_KiB;
    o.queue_depth = 8;
    o.rings = rings;
    o.max_retries = 50;
    o.make_queue = test::faulty(plan);
    tier = std::make_unique<nvme_tier>(o);
    tier->write("kept", kept.data(), kept.size()).wait();  // stored before any fault
  }
  void arm(io_kind kind, action what, std::uint64_t first, std::uint64_t count = 1, int err = EIO) {
    plan->kind = kind;
    plan->error = err;
    plan->count = count;
    plan->reads = 0;
    plan->writes = 0;
    plan->first = first;  // counted from now on
    plan->hits = 0;
    plan->what = what;
  }
  // Checks the tensor stored before the fault and that new tensors still go through.
  void expect_healthy() {
    plan->disarm();
    std::vector<unsigned char> back(kept.size());
    tier->read("kept", back.data()).wait();
    EXPECT_EQ(back, kept) << "a tensor stored before the fault was damaged";
    const auto fresh = test::random_bytes(1_MiB + 1, 99);
    tier->write("fresh", fresh.data(), fresh.size()).wait();
    std::vector<unsigned char> again(fresh.size());
    tier->read("fresh", again.data()).wait();
    EXPECT_EQ(again, fresh);
    tier->erase("fresh");
  }
};

bool names(const std::exception& e, const std::string& tensor) {
  return std::string(e.what()).find("'" + tensor + "'") != std::string::npos;
}

}  // namespace

TEST(NvmeFaults, EioOnTheKthWriteFailsThatTensorOnly) {
  for (std::uint64_t k : {1u, 3u, 8u}) {
    faulty_tier f;
    const auto before = f.tier->stats();
    f.arm(io_kind::write, action::fail, k);
    const auto data = test::random_bytes(2_MiB, k);  // 8 blocks
    auto h = f.tier->write("victim", data.data(), data.size());
    try {
      h.wait();
      FAIL() << "write with EIO on op " << k << " succeeded";
    } catch (const io_error& e) {
      EXPECT_TRUE(names(e, "victim")) << e.what();
      EXPECT_EQ(e.error_number(), EIO);
      EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
    }
    EXPECT_EQ(f.plan->hits, 1u);
    EXPECT_FALSE(f.tier->contains("victim"));
    EXPECT_EQ(f.tier->stats().free_bytes, before.free_bytes) << "a failed write kept its blocks";
    f.expect_healthy();
    f.tier->write("victim", data.data(), data.size()).wait();  // and it can be written again
  }
}

TEST(NvmeFaults, EioOnTheKthReadLeavesTheTensorStored) {
  faulty_tier f;
  f.arm(io_kind::read, action::fail, 2);
  std::vector<unsigned char> back(f.kept.size());
  try {
    f.tier->read("kept", back.data()).wait();
    FAIL() << "no error";
  } catch (const io_error& e) {
    EXPECT_TRUE(names(e, "kept")) << e.what();
    EXPECT_EQ(e.error_number(), EIO);
  }
  EXPECT_TRUE(f.tier->contains("kept"));
  f.expect_healthy();
}

TEST(NvmeFaults, ShortWritesAndReadsAreContinued) {
  faulty_tier f;
  const auto data = test::random_bytes(3_MiB + 4099, 3);
  f.arm(io_kind::write, action::short_transfer, 1, 0);
  f.tier->write("s", data.data(), data.size()).wait();
  EXPECT_GT(f.plan->hits, 0u);
  f.arm(io_kind::read, action::short_transfer, 1, 0);
  std::vector<unsigned char> back(data.size());
  f.tier->read("s", back.data()).wait();
  EXPECT_EQ(back, data);
  EXPECT_GT(f.tier->stats().short_transfers, 0u);
  f.expect_healthy();
}

TEST(NvmeFaults, EagainIsRetried) {
  faulty_tier f;
  const auto data = test::random_bytes(1_MiB + 17, 4);
  f.arm(io_kind::write, action::eagain, 1, 10);
  f.tier->write("a", data.data(), data.size()).wait();
  f.arm(io_kind::read, action::eagain, 2, 10);
  std::vector<unsigned char> back(data.size());
  f.tier->read("a", back.data()).wait();
  EXPECT_EQ(back, data);
  EXPECT_EQ(f.tier->stats().eagain_retries, 20u);
  f.expect_healthy();
}

TEST(NvmeFaults, EintrIsRetriedLikeEagain) {
  faulty_tier f;
  const auto data = test::random_bytes(1_MiB + 33, 14);
  f.arm(io_kind::write, action::eintr, 1, 4);
  f.tier->write("i", data.data(), data.size()).wait();
  f.arm(io_kind::read, action::eintr, 1, 3);
  std::vector<unsigned char> back(data.size());
  f.tier->read("i", back.data()).wait();
  EXPECT_EQ(back, data);
  EXPECT_EQ(f.tier->stats().eagain_retries, 7u);
  f.expect_healthy();
}

// A completion of 0 bytes with bytes left makes no progress: retrying it could spin for ever, so
// it fails the move with an error naming the tensor, and the tier goes on.
TEST(NvmeFaults, AZeroByteCompletionFailsTheMoveNamingTheTensorInsteadOfSpinning) {
  faulty_tier f;
  const auto data = test::random_bytes(2_MiB, 15);
  f.arm(io_kind::write, action::zero_transfer, 1, 1);
  try {
    f.tier->write("zero", data.data(), data.size()).wait();
    FAIL() << "no error";
  } catch (const io_error& e) {
    EXPECT_TRUE(names(e, "zero")) << e.what();
    EXPECT_EQ(e.error_number(), EIO);
  }
  EXPECT_FALSE(f.tier->contains("zero")) << "a failed write keeps nothing";
  f.plan->disarm();
  f.tier->write("second", data.data(), data.size()).wait();
  f.arm(io_kind::read, action::zero_transfer, 1, 1);
  std::vector<unsigned char> back(data.size());
  EXPECT_THROW(f.tier->read("second", back.data()).wait(), io_error);
  EXPECT_TRUE(f.tier->contains("second")) << "a failed read leaves the tensor stored";
  f.plan->disarm();
  f.tier->read("second", back.data()).wait();
  EXPECT_EQ(back, data);
  f.expect_healthy();
}

TEST(NvmeFaults, EndlessEagainGivesUpWithAnErrorNamingTheTensor) {
  faulty_tier f;
  const auto data = test::random_bytes(300_KiB, 5);
  f.arm(io_kind::write, action::eagain, 1, 0);
  try {
    f.tier->write("stuck", data.data(), data.size()).wait();
    FAIL() << "no error";
  } catch (const io_error& e) {
    EXPECT_TRUE(names(e, "stuck")) << e.what();
    EXPECT_EQ(e.error_number(), EAGAIN);
  }
  EXPECT_FALSE(f.tier->contains("stuck"));
  f.expect_healthy();
}

TEST(NvmeFaults, EnospcOnAWriteIsAnIoErrorNamingTheTensor) {
  faulty_tier f;
  const auto data = test::random_bytes(1_MiB, 6);
  f.arm(io_kind::write, action::fail, 2, 1, ENOSPC);
  try {
    f.tier->write("big", data.data(), data.size()).wait();
    FAIL() << "no error";
  } catch (const io_error& e) {
    EXPECT_TRUE(names(e, "big")) << e.what();
    EXPECT_EQ(e.error_number(), ENOSPC);
  }
  EXPECT_FALSE(f.tier->contains("big"));
  f.expect_healthy();
}

TEST(NvmeFaults, BlockCorruptedOnDiskIsACorruptionErrorNamingTensorAndOffset) {
  faulty_tier f;
  const auto data = test::random_bytes(1_MiB, 8);  // 4 blocks of 256 KiB
  f.arm(io_kind::write, action::corrupt_on_disk, 3);  // the third block written
  f.tier->write("rotten", data.data(), data.size()).wait();
  f.plan->disarm();
  ASSERT_EQ(f.plan->hits, 1u);
  std::vector<unsigned char> back(data.size());
  try {
    f.tier->read("rotten", back.data()).wait();
    FAIL() << "corruption not detected";
  } catch (const corruption_error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(names(e, "rotten")) << m;
    EXPECT_NE(m.find("at offset "), std::string::npos) << m;
    EXPECT_NE(m.find("checksum"), std::string::npos) << m;
  }
  EXPECT_TRUE(f.tier->contains("rotten"));  // still there: the caller decides
  f.expect_healthy();
}

TEST(NvmeFaults, FaultsOnSeveralRingsStillNameTheTensor) {
  faulty_tier f(3);
  const auto data = test::random_bytes(4_MiB, 10);
  f.arm(io_kind::write, action::fail, 5, 3);
  EXPECT_THROW(f.tier->write("multi", data.data(), data.size()).wait(), io_error);
  EXPECT_FALSE(f.tier->contains("multi"));
  f.expect_healthy();
}

// ---- one of several striped directories failing ------------------------------------------------

namespace {

// Three swap directories; the opener notes which descriptor is whose, so faults can hit the file
// of one directory only.
struct striped_tier {
  test::temp_dir dirs[3];
  std::map<std::string, int> fd_of;
  std::shared_ptr<test::fault_plan> plan = std::make_shared<test::fault_plan>();
  std::unique_ptr<nvme_tier> tier;

  striped_tier() {
    nvme_options o;
    for (auto& d : dirs) o.directories.push_back(d.path());
    o.reserve = 24_MiB;
    o.block_size = 256_KiB;
    o.queue_depth = 8;
    o.make_queue = test::faulty(plan);
    o.open_file = [this](const std::string& path, int flags, mode_t mode) {
      const int fd = ::open(path.c_str(), flags, mode);
      if (fd < 0) return -errno;
      for (auto& d : dirs)
        if (path.rfind(d.path(), 0) == 0) fd_of[d.path()] = fd;
      return fd;
    };
    tier = std::make_unique<nvme_tier>(o);
  }
  void fail_only(const std::string& dir, io_kind kind, int err) {
    plan->only_fd = fd_of.at(dir);
    plan->kind = kind;
    plan->error = err;
    plan->reads = 0;
    plan->writes = 0;
    plan->first = 1;
    plan->count = 0;
    plan->hits = 0;
    plan->what = action::fail;
  }
  [[nodiscard]] bool all_empty() const {
    return dirs[0].empty() && dirs[1].empty() && dirs[2].empty();
  }
};

}  // namespace

TEST(NvmeFaults, OneOfThreeStripedDirectoriesFailingNamesThatDirectoryAndLosesNothing) {
  std::string paths[3];
  {
    striped_tier s;
    for (int i = 0; i < 3; ++i) paths[i] = s.dirs[i].path();
    const auto kept = test::random_bytes(3_MiB + 11, 21);  // 13 blocks: every file holds some
    s.tier->write("kept", kept.data(), kept.size()).wait();
    const auto before = s.tier->stats();

    // A write whose blocks in the second directory fail: the error names that directory and the
    // tensor, and nothing of it stays in any directory's file.
    s.fail_only(paths[1], io_kind::write, EIO);
    const auto data = test::random_bytes(3_MiB, 22);
    try {
      s.tier->write("striped", data.data(), data.size()).wait();
      FAIL() << "a write with a failing directory succeeded";
    } catch (const io_error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(names(e, "striped")) << m;
      EXPECT_NE(m.find("'" + paths[1] + "'"), std::string::npos) << m;
      EXPECT_EQ(m.find(paths[0]), std::string::npos) << "blames a healthy directory: " << m;
      EXPECT_EQ(m.find(paths[2]), std::string::npos) << "blames a healthy directory: " << m;
      EXPECT_EQ(e.error_number(), EIO);
    }
    EXPECT_GT(s.plan->hits, 0u);
    EXPECT_FALSE(s.tier->contains("striped"));
    EXPECT_EQ(s.tier->stats().free_bytes_per_file, before.free_bytes_per_file) << "a failed write kept blocks";

    // A read whose blocks in the third directory fail: named, and the tensor stays stored.
    s.fail_only(paths[2], io_kind::read, EIO);
    std::vector<unsigned char> back(kept.size());
    try {
      s.tier->read("kept", back.data()).wait();
      FAIL() << "a read with a failing directory succeeded";
    } catch (const io_error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(names(e, "kept")) << m;
      EXPECT_NE(m.find("'" + paths[2] + "'"), std::string::npos) << m;
    }
    EXPECT_TRUE(s.tier->contains("kept"));
    s.plan->disarm();
    s.tier->read("kept", back.data()).wait();
    EXPECT_EQ(back, kept) << "the tensor stored before the fault was damaged";
    s.tier->write("striped", data.data(), data.size()).wait();  // the directory works again
    std::vector<unsigned char> again(data.size());
    s.tier->read("striped", again.data()).wait();
    EXPECT_EQ(again, data);
    s.tier.reset();
    EXPECT_TRUE(s.all_empty()) << "a swap file was left behind";
  }
}

// ---- a disk filling up mid-write -----------------------------------------------------------------

// A block written in part and then refused with ENOSPC is a write error that says so and names
// the directory; the tensor is not stored, so no read can later report a checksum mismatch.
TEST(NvmeFaults, AShortWriteThenEnospcSaysNoSpaceNamingTheDirectoryNotAChecksumMismatch) {
  faulty_tier f;
  const auto before = f.tier->stats();
  f.arm(io_kind::write, action::short_then_fail, 2, 1, ENOSPC);
  const auto data = test::random_bytes(1_MiB, 31);
  try {
    f.tier->write("full", data.data(), data.size()).wait();
    FAIL() << "a write onto a full disk succeeded";
  } catch (const corruption_error& e) {
    FAIL() << "a full disk reported as corruption: " << e.what();
  } catch (const io_error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.error_number(), ENOSPC) << m;
    EXPECT_NE(m.find("No space left on device"), std::string::npos) << m;
    EXPECT_NE(m.find("'" + f.dir.path() + "'"), std::string::npos) << m;
    EXPECT_TRUE(names(e, "full")) << m;
    EXPECT_EQ(m.find("checksum"), std::string::npos) << m;
  }
  EXPECT_GT(f.tier->stats().short_transfers, before.short_transfers) << "the short write was not continued";
  EXPECT_FALSE(f.tier->contains("full")) << "a write that hit a full disk was stored";
  EXPECT_EQ(f.tier->stats().free_bytes, before.free_bytes);
  f.expect_healthy();
}

// On a file system without O_DIRECT the page cache takes the write and a full disk shows only at
// writeback (Note [Buffered writes and a full disk]): such writes are flushed before they count
// as stored, and they still round-trip.
TEST(NvmeFaults, BufferedWritesAreFlushedAndRoundTrip) {
  test::temp_dir dir;
  nvme_options o;
  o.directories = {dir.path()};
  o.reserve = 8_MiB;
  o.block_size = 256_KiB;
  int opened = 0;
  o.open_file = [&](const std::string& path, int flags, mode_t mode) {
    if ((flags & O_DIRECT) != 0) return -EINVAL;  // as tmpfs and some network file systems answer
    ++opened;
    const int fd = ::open(path.c_str(), flags, mode);
    return fd >= 0 ? fd : -errno;
  };
  nvme_tier tier(o);
  EXPECT_FALSE(tier.direct_io());
  EXPECT_EQ(opened, 1);
  const auto data = test::random_bytes(1_MiB + 3, 41);
  tier.write("b", data.data(), data.size()).wait();
  std::vector<unsigned char> back(data.size());
  tier.read("b", back.data()).wait();
  EXPECT_EQ(back, data);
}
