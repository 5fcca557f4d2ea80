// CRC32C (Castagnoli), the checksum the NVMe tier keeps for every block it writes.
// Uses the SSE4.2 crc32 instruction when the CPU has it (checked at run time), else a table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spillway {

/// CRC32C of `bytes` bytes at `data`, continuing from `crc` (0 to start). Chaining holds:
/// crc32c(b, nb, crc32c(a, na)) == crc32c(a ++ b). Check value: crc32c("123456789") == 0xE3069283.
[[nodiscard]] std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

namespace detail {
/// The portable table implementation (always available; exposed for tests).
[[nodiscard]] std::uint32_t crc32c_table(const void* data, std::size_t bytes, std::uint32_t crc) noexcept;
/// The SSE4.2 implementation; call only when crc32c_hardware_available().
[[nodiscard]] std::uint32_t crc32c_sse42(const void* data, std::size_t bytes, std::uint32_t crc) noexcept;
/// True when this CPU has the SSE4.2 crc32 instruction.
[[nodiscard]] bool crc32c_hardware_available() noexcept;
}  // namespace detail

}  // namespace spillway
