// Spillway's exception hierarchy and the checking macros every layer uses.
// Library code reports problems by throwing these; it never prints.
#pragma once

#include <cstddef>
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
[[noreturn]] void throw_expects(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace spillway

/// Throws spillway::error (or the given type via SPILLWAY_EXPECTS_T) when `cond` is false.
#define SPILLWAY_EXPECTS(cond, msg)                                           \
  do {                                                                        \
    if (!(cond)) ::spillway::detail::throw_expects(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

/// Throws `type(msg + location)` when `cond` is false.
#define SPILLWAY_EXPECTS_T(type, cond, msg)                                            \
  do {                                                                                 \
    if (!(cond))                                                                       \
      throw type(std::string(msg) + " (" + __FILE__ + ":" + std::to_string(__LINE__) + ")"); \
  } while (0)
