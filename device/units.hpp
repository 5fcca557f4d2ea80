// Byte sizes written the way people write them: 1048576, 512MiB, 6GiB, 1.5GB.
// Parsing is strict: anything else is a config_error that quotes what was given.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spillway {

/// The largest size Spillway accepts anywhere (1 PiB); larger inputs are taken as typos.
inline constexpr std::uint64_t max_size_bytes = 1ULL << 50;

/// Parses "1048576", "4096B", "512KiB", "512MiB", "6GiB", "1.5GB", "2TB" (binary suffixes
/// KiB/MiB/GiB/TiB, decimal KB/MB/GB/TB, case-insensitive, optional space before the unit).
/// Throws config_error for empty, negative, zero (unless allow_zero), fractional bytes,
/// unknown units and sizes above max_size_bytes. `what` names the setting in the message.
std::uint64_t parse_size(std::string_view text, std::string_view what = "size", bool allow_zero = false);

/// n rounded up to the next multiple of a (a > 0): block sizes, page lengths, alignments.
constexpr std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

/// "1.50 GiB", "512.00 MiB", "17 B": for reports and error messages.
std::string format_bytes(std::uint64_t bytes);

/// A size for an error message's "at least ...": as format_bytes, but rounded up, never down,
/// with the exact byte count beside it where the rounding moved it ("11.01 MiB (11535361
/// bytes)"), so that what the message asks for is enough and can be given back as written.
std::string format_bytes_at_least(std::uint64_t bytes);

/// A ratio, share or time as a person would write it, for error messages that echo what was
/// given: "0", "0.25", "-1.5", "1e+06" (six significant digits), not "0.000000".
std::string format_real(double v);

/// `v` as std::to_chars writes it in `how` with `precision` digits (fixed: after the point;
/// general: significant), as printf's %f and %g do in the "C" locale, whatever locale the
/// program has set: the decimal point is always '.', so what one part writes another reads.
std::string format_number(double v, std::chars_format how, int precision);

namespace literals {
constexpr std::uint64_t operator""_KiB(unsigned long long v) { return v << 10; }
constexpr std::uint64_t operator""_MiB(unsigned long long v) { return v << 20; }
constexpr std::uint64_t operator""_GiB(unsigned long long v) { return v << 30; }
}  // namespace literals

}  // namespace spillway
