// An enum's string form and its parse through one table of names, in the enum's value order
// (value i is names[i]). Used by trace.cpp and plan.cpp for the enums they own.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace spillway::detail {

template <class E, std::size_t N>
[[nodiscard]] constexpr std::string_view enum_name(const std::string_view (&names)[N], E e) noexcept {
  return names[static_cast<std::size_t>(e)];
}

template <class E, std::size_t N>
[[nodiscard]] constexpr std::optional<E> parse_enum(const std::string_view (&names)[N], std::string_view s) noexcept {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}

}  // namespace spillway::detail
