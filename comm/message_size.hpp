// comm/: the largest message one MPI call carries. Larger transfers go as several messages, so
// that counts stay below INT_MAX bytes and reduce_scatter_sum's staging stays bounded.
#pragma once

#include <cstddef>

namespace spillway::comm::detail {

/// Bytes per MPI message (default 16 MiB). Every rank must use the same value.
[[nodiscard]] std::size_t max_message_bytes() noexcept;
/// For tests (chunked transfers without gigabyte buffers): sets the value on this rank and
/// returns the old one. `bytes` >= 4; call it on every rank, between collectives.
std::size_t set_max_message_bytes(std::size_t bytes);

}  // namespace spillway::comm::detail
