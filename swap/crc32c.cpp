// CRC32C: a slicing-by-8 table version for any CPU and an SSE4.2 version chosen at run time.
// Both work on the reflected polynomial 0x82F63B78 with pre- and post-inversion.
#include "swap/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define SPILLWAY_CRC32C_X86 1
#else
#define SPILLWAY_CRC32C_X86 0
#endif

namespace spillway {
namespace {

constexpr std::uint32_t polynomial = 0x82F63B78u;  // CRC32C, reflected

using crc_tables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr crc_tables make_tables() {
  crc_tables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? (c >> 1) ^ polynomial : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t s = 1; s < 8; ++s)
    for (std::uint32_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
  return t;
}

constexpr crc_tables tables = make_tables();

}  // namespace

namespace detail {

std::uint32_t crc32c_table(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  while (bytes >= 8) {  // slicing by 8 (little-endian loads)
    std::uint32_t lo = 0;
    std::uint32_t hi = 0;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = tables[7][lo & 0xFF] ^ tables[6][(lo >> 8) & 0xFF] ^ tables[5][(lo >> 16) & 0xFF] ^
        tables[4][lo >> 24] ^ tables[3][hi & 0xFF] ^ tables[2][(hi >> 8) & 0xFF] ^
        tables[1][(hi >> 16) & 0xFF] ^ tables[0][hi >> 24];
    p += 8;
    bytes -= 8;
  }
  while (bytes-- > 0) c = (c >> 8) ^ tables[0][(c ^ *p++) & 0xFFu];
  return ~c;
}

#if SPILLWAY_CRC32C_X86
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const void* data, std::size_t bytes,
                                                             std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = ~crc;
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
    --bytes;
  }
  while (bytes >= 8) {
    std::uint64_t v = 0;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    bytes -= 8;
  }
  while (bytes-- > 0) c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
  return ~static_cast<std::uint32_t>(c);
}

bool crc32c_hardware_available() noexcept {
  static const bool available = __builtin_cpu_supports("sse4.2") != 0;
  return available;
}
#else
std::uint32_t crc32c_sse42(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  return crc32c_table(data, bytes, crc);
}
bool crc32c_hardware_available() noexcept { return false; }
#endif

}  // namespace detail

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  return detail::crc32c_hardware_available() ? detail::crc32c_sse42(data, bytes, crc)
                                             : detail::crc32c_table(data, bytes, crc);
}

}  // namespace spillway
