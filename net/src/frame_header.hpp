// A link frame's 6-byte header: [u32 little-endian length][u8 kind][u8 flags], the length counting
// kind, flags and body, and the little-endian integers inside link messages. Shared by the
// socket's frames and the lane's rings (the link*.cpp files, lane.cpp, head_link.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace troupe::net {

inline constexpr std::size_t kFrameHeader = 6;

// An unsigned integer written to / read from sizeof(T) bytes, little-endian.
template <class T>
void put_le(char* to, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) to[i] = char((v >> (8 * i)) & 0xFF);
}
template <class T>
T get_le(const char* from) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= T(static_cast<unsigned char>(from[i])) << (8 * i);
  return v;
}

inline void put_header(char* h, std::uint32_t body, char kind, std::uint8_t flags) {
  put_le<std::uint32_t>(h, body + 2);
  h[4] = kind;
  h[5] = char(flags);
}

// The body's size, or nullopt when over `max` or malformed.
inline std::optional<std::size_t> parse_header(const unsigned char* h, std::uint32_t max, char& kind,
                                               std::uint8_t& flags) {
  const std::uint32_t n = get_le<std::uint32_t>(reinterpret_cast<const char*>(h));
  if (n < 2 || n - 2 > max) return std::nullopt;
  kind = char(h[4]);
  flags = h[5];
  return std::size_t(n - 2);
}

}  // namespace troupe::net
