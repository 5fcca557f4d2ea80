// Out-of-line pieces of the error hierarchy: the one location format, and copies of errors
// handed to another thread.
#include "device/error.hpp"

#include <new>
#include <string_view>
#include <typeinfo>
#include <utility>

namespace spillway::detail {

// Note [Errors that cross threads]
// An error found on an I/O or worker thread is reported on the caller's thread, as an
// std::exception_ptr. The C++ runtime counts an exception's owners with atomics inside its own
// library, which ThreadSanitizer does not see: when the last owner lets go on the thread that
// found the error after the caller has read the message, the tool sees a read and a free with
// nothing ordering them and ends the run, though the count did order them. The caller often
// drops the move's handle first and reads the message after (the executor does), so the
// thread's own hold, ended later, is the last. Two rules keep every such free ordered:
//  - the caller never reads the thread's exception object outside the move's lock: a move
//    handle's error() returns copy_error of it, made under that lock, which only the caller
//    owns; the move's state, which holds the original, is a shared_ptr, whose count the tool
//    does see, so its last release on the other thread comes after that lock;
//  - a thread hands an error on by moving it, and where it keeps one itself (an NVMe move
//    keeps its own until its last block comes back), it hands on a copy_error of it.
// Neither changes what the caller sees: the copy has the original's type, message and errno.

namespace {
// A copy when `x` is exactly a T (a type derived elsewhere, like comm_error, is not known here).
template <class T, class... Args>
std::exception_ptr copy_if_exactly(const std::exception& x, const std::exception_ptr& e, Args&&... args) {
  if (typeid(x) != typeid(T)) return e;
  return std::make_exception_ptr(T(x.what(), std::forward<Args>(args)...));
}
}  // namespace

std::exception_ptr copy_error(const std::exception_ptr& e) noexcept {
  if (!e) return e;
  try {
    try {
      std::rethrow_exception(e);
    } catch (const corruption_error& x) {
      return copy_if_exactly<corruption_error>(x, e);
    } catch (const io_error& x) {
      return copy_if_exactly<io_error>(x, e, x.error_number());
    } catch (const out_of_memory& x) {
      return copy_if_exactly<out_of_memory>(x, e);
    } catch (const config_error& x) {
      return copy_if_exactly<config_error>(x, e);
    } catch (const usage_error& x) {
      return copy_if_exactly<usage_error>(x, e);
    } catch (const cuda_error& x) {
      return copy_if_exactly<cuda_error>(x, e);
    } catch (const error& x) {
      return copy_if_exactly<error>(x, e);
    } catch (const std::bad_alloc&) {
      return std::make_exception_ptr(std::bad_alloc());
    } catch (...) {
      return e;
    }
  } catch (...) {  // building the copy ran out of memory: the original still says what went wrong
    return e;
  }
}

std::string location_suffix(const char* file, int line) {
  std::string_view f(file);
  while (f.starts_with("../")) f.remove_prefix(3);
  return " [at " + std::string(f) + ":" + std::to_string(line) + "]";
}

}  // namespace spillway::detail
