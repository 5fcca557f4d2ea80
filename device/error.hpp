// Spillway's exception hierarchy and the checking macros every layer uses.
// Library code reports problems by throwing these; it never prints.
//
// The error policy (one kind per cause; docs/design.md repeats it):
//   config_error   bad input: a setting, size, file or trace that does not make sense. The message
//                  names the input and where it came from (the flag, the SPILLWAY_* variable, the
//                  JSON key, the file) and says what would be right. It carries no source
//                  location: the mistake is in the input, not in Spillway. Thrown before any work.
//   usage_error    the API called out of order or with something it did not hand out (an op
//                  outside an iteration, an unknown handle). Names the call; carries a location.
//   io_error       a tier or a file failed; names the file or tensor and the errno.
//   corruption_error  bytes read back are not the bytes written (an io_error).
//   out_of_memory  a request that cannot be met; names what, how much, and what would fit.
//   cuda_error     the CUDA runtime or one of its libraries failed; names the call.
//   error          the base; thrown as itself only when an internal invariant breaks (a bug).
// Every check goes through one macro family, SPILLWAY_EXPECTS / SPILLWAY_EXPECTS_T (and
// SPILLWAY_CUDA_TRY for CUDA calls), which append the location in one format: " [at file:line]".
#pragma once

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>

namespace spillway {

/// Base of every exception Spillway throws. what() names the file and line that raised it.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A request for memory that cannot be met (device, budget, pinned host pool, swap space).
class out_of_memory : public error {
 public:
  using error::error;
};

/// A read or write to a tier failed; the message names the tensor and the offset.
class io_error : public error {
 public:
  io_error(const std::string& what, int err) : error(what), errno_(err) {}
  /// The positive errno value the operating system reported (0 when there was none).
  [[nodiscard]] int error_number() const noexcept { return errno_; }

 private:
  int errno_;
};

/// Input that does not make sense: a size that does not parse, a budget past the device, ...
class config_error : public error {
 public:
  using error::error;
};

/// The API used out of order or with something it did not hand out: a misuse by the caller.
class usage_error : public error {
 public:
  using error::error;
};

/// Bytes read back from a tier are not the bytes written (checksum mismatch).
class corruption_error : public io_error {
 public:
  explicit corruption_error(const std::string& what) : io_error(what, 0) {}
};

/// A failure reported by the CUDA runtime or one of its libraries; names the call.
class cuda_error : public error {
 public:
  using error::error;
};

namespace detail {
/// A new exception object of the same Spillway type, message and errno as `e` (std::bad_alloc
/// stays std::bad_alloc); any other exception, and null, come back as they are. For an error
/// handed to another thread while this one keeps the original (Note [Errors that cross threads]).
[[nodiscard]] std::exception_ptr copy_error(const std::exception_ptr& e) noexcept;

/// " [at file:line]", with the build's leading "../" steps taken off the file's path: the one
/// location format of every message that carries one.
[[nodiscard]] std::string location_suffix(const char* file, int line);

template <class Error>
[[noreturn, gnu::cold]] void throw_at(const char* file, int line, const std::string& msg) {
  throw Error(msg + location_suffix(file, line));
}
}  // namespace detail

}  // namespace spillway

/// Throws spillway::error (an internal invariant broke) when `cond` is false.
#define SPILLWAY_EXPECTS(cond, msg)                                                       \
  do {                                                                                    \
    if (!(cond)) ::spillway::detail::throw_at<::spillway::error>(__FILE__, __LINE__, (msg)); \
  } while (0)

/// Throws `type` (usage_error, out_of_memory, ...) when `cond` is false, in the same format.
#define SPILLWAY_EXPECTS_T(type, cond, msg)                                   \
  do {                                                                        \
    if (!(cond)) ::spillway::detail::throw_at<type>(__FILE__, __LINE__, (msg)); \
  } while (0)
