// CRC32C: a slicing-by-8 table version for any CPU and an SSE4.2 version chosen at run time.
// Both work on the reflected polynomial 0x82F63B78 with pre- and post-inversion.
#include "swap/crc32c.hpp"

#include <algorithm>
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

// GF(2) polynomials modulo P in the reflected bit order (x^0 is the top bit).
// multmodp: a * b mod P. x8nmodp: x^(8 n) mod P, the operator that moves a CRC past n zeros.
constexpr std::uint32_t multmodp(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t m = 1u << 31;
  std::uint32_t product = 0;
  for (;;) {
    if ((a & m) != 0) {
      product ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1u) != 0 ? (b >> 1) ^ polynomial : b >> 1;
  }
  return product;
}

constexpr std::array<std::uint32_t, 32> make_powers() {  // x^(2^k) mod P
  std::array<std::uint32_t, 32> t{};
  std::uint32_t p = 1u << 30;  // x^1
  for (auto& v : t) {
    v = p;
    p = multmodp(p, p);
  }
  return t;
}

constexpr std::array<std::uint32_t, 32> powers = make_powers();

constexpr std::uint32_t x8nmodp(std::size_t n) noexcept {
  std::uint32_t p = 1u << 31;  // x^0
  unsigned k = 3;              // 8 n = n * 2^3
  for (; n != 0 && k < 32; n >>= 1, ++k)
    if ((n & 1u) != 0) p = multmodp(powers[k], p);
  return p;
}

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
namespace {

// One dependency chain of crc32 instructions runs at a third of the unit's rate (latency 3,
// throughput 1), so long inputs go as three interleaved chains over three equal parts, joined
// by CRC combination: crc(A || B) = crc(A) * x^(8 |B|) mod P  xor  crc(B).
__attribute__((target("sse4.2"))) std::uint64_t chain(std::uint64_t c, const unsigned char* p, std::size_t n) noexcept {
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t v = 0;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  for (; n > 0; --n) c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
  return c;
}

}  // namespace

__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const void* data, std::size_t bytes,
                                                             std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = ~crc;
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
    --bytes;
  }
  while (bytes >= 3 * 512) {  // rounds of at most 3 x 256 KiB keep x8nmodp's k below 32
    const std::size_t part = std::min<std::size_t>(bytes / 3 / 8 * 8, std::size_t{256} << 10);
    std::uint64_t c0 = c;
    std::uint64_t c1 = 0xFFFFFFFFu;
    std::uint64_t c2 = 0xFFFFFFFFu;
    const unsigned char* p1 = p + part;
    const unsigned char* p2 = p + 2 * part;
    for (std::size_t i = 0; i < part; i += 8) {
      std::uint64_t v0 = 0, v1 = 0, v2 = 0;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p1 + i, 8);
      std::memcpy(&v2, p2 + i, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    const std::uint32_t shift = x8nmodp(part);
    std::uint32_t r = ~static_cast<std::uint32_t>(c0);
    r = multmodp(shift, r) ^ ~static_cast<std::uint32_t>(c1);
    r = multmodp(shift, r) ^ ~static_cast<std::uint32_t>(c2);
    c = ~r;
    p += 3 * part;
    bytes -= 3 * part;
  }
  return ~static_cast<std::uint32_t>(chain(c, p, bytes));
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
