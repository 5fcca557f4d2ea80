// The pread/pwrite queue the NVMe tier falls back to without io_uring: the io_queue contract
// (every op comes back once, short transfers and errors as an io_uring CQE reports them), and the
// fallback itself (io_uring refused -> threads, with one warning).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "device/error.hpp"
#include "device/log.hpp"
#include "swap/thread_queue.hpp"
#include "swap_test_support.hpp"

using namespace spillway;

namespace {

std::vector<io_completion> reap_all(io_queue& q, std::size_t n) {
  std::vector<io_completion> out;
  std::vector<io_completion> buf(8);
  for (int tries = 0; out.size() < n && tries < 1000; ++tries) {
    const std::size_t got = q.reap(buf, std::chrono::milliseconds(10));
    out.insert(out.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(got));
  }
  return out;
}

}  // namespace

TEST(ThreadQueue, WritesAndReadsComeBackOnceEachWithShortAndFailedTransfersAsCqesSayThem) {
  test::temp_dir dir;
  const std::string path = dir.path() + "/f";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  auto q = make_thread_queue(8);
  EXPECT_EQ(q->depth(), 8u);
  EXPECT_EQ(q->register_buffers({}), -EOPNOTSUPP);
  // Eight writes of 4 KiB, each its own byte, in flight at once.
  std::vector<std::vector<char>> data(8, std::vector<char>(4096));
  std::vector<io_op> ops(8);
  std::vector<io_op*> ptrs;
  for (int i = 0; i < 8; ++i) {
    std::memset(data[i].data(), 'a' + i, 4096);
    ops[i] = io_op{io_kind::write, fd, data[i].data(), 4096, std::uint64_t(i) * 4096, -1};
    ptrs.push_back(&ops[i]);
  }
  q->submit(ptrs);
  auto done = reap_all(*q, 8);
  ASSERT_EQ(done.size(), 8u);
  std::set<io_op*> seen;
  for (const auto& c : done) {
    EXPECT_EQ(c.result, 4096);
    EXPECT_TRUE(seen.insert(c.op).second) << "an op came back twice";
  }
  // Reads back; the last one runs past the end of the file: a short transfer, as a CQE says it.
  std::vector<char> back(4096), tail(4096);
  io_op rd{io_kind::read, fd, back.data(), 4096, 3 * 4096, -1};
  io_op past{io_kind::read, fd, tail.data(), 4096, 8 * 4096 - 100, -1};
  io_op bad{io_kind::read, -1, tail.data(), 16, 0, -1};
  io_op* more[] = {&rd, &past, &bad};
  q->submit(more);
  done = reap_all(*q, 3);
  ASSERT_EQ(done.size(), 3u);
  for (const auto& c : done) {
    const int want = c.op == &rd ? 4096 : c.op == &past ? 100 : -EBADF;
    EXPECT_EQ(c.result, want);
  }
  EXPECT_EQ(back, data[3]);
  // Nothing in flight: reap waits out its timeout and returns nothing.
  std::vector<io_completion> none(4);
  EXPECT_EQ(q->reap(none, std::chrono::milliseconds(1)), 0u);
  ::close(fd);
}

TEST(ThreadQueue, MoreThanTheDepthIsMisuse) {
  auto q = make_thread_queue(1);
  char b[16];
  io_op a{io_kind::read, -1, b, 16, 0, -1}, c{io_kind::read, -1, b, 16, 0, -1};
  io_op* two[] = {&a, &c};
  EXPECT_THROW(q->submit(two), usage_error);
}

TEST(ThreadQueue, ATierWhoseIoUringIsRefusedFallsBackToThreadsWithOneWarning) {
  std::vector<std::string> warnings;
  const auto old = set_log_sink([&](log_level l, const std::string& m) {
    if (l == log_level::warning) warnings.push_back(m);
  });
  int attempts = 0;
  auto refused = [&](unsigned) -> std::unique_ptr<io_queue> {
    ++attempts;
    throw io_error("io_uring setup failed (depth 8): Operation not permitted", EPERM);
  };
  bool works = true;
  auto q1 = make_queue_or_threads(8, refused, works);
  auto q2 = make_queue_or_threads(8, refused, works);
  set_log_sink(old);
  EXPECT_FALSE(works);
  EXPECT_EQ(attempts, 1) << "once refused, not asked again";
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("pread/pwrite"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("Operation not permitted"), std::string::npos) << warnings[0];
  EXPECT_EQ(q1->register_buffers({}), -EOPNOTSUPP) << "a thread queue";
  // Where io_uring works, it is what the tier gets.
  bool fine = true;
  auto ring = make_queue_or_threads(8, [](unsigned d) { return make_thread_queue(d + 1); }, fine);
  EXPECT_TRUE(fine);
  EXPECT_EQ(ring->depth(), 9u);
}
