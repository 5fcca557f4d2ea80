// Errors handed from an I/O or worker thread to the caller (Note [Errors that cross threads]):
// copy_error keeps the type, message and errno of Spillway's errors and leaves others alone, and
// a move handle's error() is a copy only the caller holds, so the thread's own hold on the
// original may end after the caller has dropped the handle and read the message. Under
// ThreadSanitizer (scripts/test runs this suite so) the last test fails if the caller reads the
// thread's own exception object.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>

#include "device/error.hpp"
#include "swap/move_handle.hpp"

using namespace spillway;

namespace {

// The exception object `e` holds, as the base every thrown type here shares.
const std::exception* object_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return &x;
  } catch (...) {
    return nullptr;
  }
}

template <class T>
void expect_copied(const T& original) {
  const auto e = std::make_exception_ptr(original);
  const auto c = detail::copy_error(e);
  ASSERT_TRUE(c);
  const auto* a = object_of(e);
  const auto* b = object_of(c);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b) << typeid(T).name() << ": the copy is the original object";
  EXPECT_EQ(typeid(*a), typeid(*b)) << "the copy of a " << typeid(*a).name() << " is a " << typeid(*b).name();
  EXPECT_STREQ(a->what(), b->what());
}

struct local_io_error : io_error {
  local_io_error() : io_error("a kind of io_error copy_error does not know", EIO) {}
};

}  // namespace

TEST(CopyError, KeepsTheTypeAndMessageOfEachSpillwayError) {
  expect_copied(io_error("write of tensor 'a' failed", ENOSPC));
  expect_copied(corruption_error("read of tensor 'b': checksum mismatch"));
  expect_copied(out_of_memory("no room for 4 MiB"));
  expect_copied(config_error("budget '12 parsecs' does not parse"));
  expect_copied(usage_error("op outside an iteration"));
  expect_copied(cuda_error("cudaMemcpyAsync failed"));
  expect_copied(error("an invariant broke"));
  expect_copied(std::bad_alloc());
}

TEST(CopyError, KeepsTheErrno) {
  const auto c = detail::copy_error(std::make_exception_ptr(io_error("full", ENOSPC)));
  try {
    std::rethrow_exception(c);
  } catch (const corruption_error&) {
    FAIL() << "an io_error came back as a corruption_error";
  } catch (const io_error& x) {
    EXPECT_EQ(x.error_number(), ENOSPC);
  }
}

TEST(CopyError, LeavesOtherExceptionsAndNullAsTheyAre) {
  EXPECT_FALSE(detail::copy_error(nullptr));
  for (const auto& e : {std::make_exception_ptr(std::runtime_error("not ours")),
                        std::make_exception_ptr(local_io_error()), std::make_exception_ptr(7)}) {
    const auto c = detail::copy_error(e);
    EXPECT_TRUE(c == e) << "an exception of a type copy_error does not know was replaced";
  }
}

TEST(MoveHandleError, IsACopyOnlyTheCallerHolds) {
  auto state = std::make_shared<detail::move_state>();
  const auto original = std::make_exception_ptr(io_error("read of tensor 'x' failed", EIO));
  state->finish(original);
  move_handle h(state);
  const auto first = h.error();
  const auto second = h.error();
  EXPECT_NE(object_of(first), object_of(original));
  EXPECT_NE(object_of(first), object_of(second));
  EXPECT_STREQ(object_of(first)->what(), "read of tensor 'x' failed");
  EXPECT_THROW(h.wait_enqueued(), io_error);
  auto clean = std::make_shared<detail::move_state>();
  clean->finish(nullptr);
  EXPECT_FALSE(move_handle(clean).error());
}

// The executor's order: take the error, drop the handle, read the message and let go of it, while
// the thread that failed lets go of its own hold on the move only afterwards, with nothing (a lock, a
// release store) ordering the two: a relaxed flag only makes the order the likely one.
TEST(MoveHandleError, OutlivesTheHandleWhileTheFailingThreadLetsGoLast) {
  for (int round = 0; round < 20; ++round) {
    auto state = std::make_shared<detail::move_state>();
    std::atomic<bool> read{false};
    std::thread failing([keep = state, &read]() mutable {
      keep->finish(std::make_exception_ptr(io_error("write of tensor 'a' failed: No space left on device", ENOSPC)));
      while (!read.load(std::memory_order_relaxed)) std::this_thread::yield();
      keep.reset();  // the last hold on the move, and on the thread's exception object
    });
    move_handle h(std::move(state));
    while (!h.enqueued()) std::this_thread::yield();
    std::string message;
    {
      auto e = h.error();
      h = move_handle();
      try {
        std::rethrow_exception(e);
      } catch (const io_error& x) {
        message = x.what();
        EXPECT_EQ(x.error_number(), ENOSPC);
      }
    }  // the caller holds nothing of the move from here on
    read.store(true, std::memory_order_relaxed);
    failing.join();
    EXPECT_EQ(message, "write of tensor 'a' failed: No space left on device");
  }
}
