// Text for the GPT example: a file read as bytes (each byte one token), or an English-like
// corpus generated from a small grammar when no file is given (tests, bench).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace spillway::examples {

/// The bytes of `path`. config_error naming the path when it is a folder or cannot be read, or
/// holds fewer than `min_bytes` bytes.
[[nodiscard]] std::string load_corpus(const std::string& path, std::size_t min_bytes);

/// About `bytes` bytes of sentences from a small grammar of the project's own; the same seed
/// gives the same text.
[[nodiscard]] std::string generate_corpus(std::uint64_t seed, std::size_t bytes);

}  // namespace spillway::examples
