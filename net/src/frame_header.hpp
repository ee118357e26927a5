// A link frame's 6-byte header: [u32 little-endian length][u8 kind][u8 flags], the length counting
// kind, flags and body. Shared by the socket's frames and the lane's rings (link.cpp, lane.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace troupe::net {

inline constexpr std::size_t kFrameHeader = 6;

inline void put_header(char* h, std::uint32_t body, char kind, std::uint8_t flags) {
  std::uint32_t n = body + 2;
  for (int i = 0; i < 4; ++i) h[i] = char((n >> (8 * i)) & 0xFF);
  h[4] = kind;
  h[5] = char(flags);
}

// The body's size, or nullopt when over `max` or malformed.
inline std::optional<std::size_t> parse_header(const unsigned char* h, std::uint32_t max, char& kind,
                                               std::uint8_t& flags) {
  std::uint32_t n = std::uint32_t(h[0]) | std::uint32_t(h[1]) << 8 | std::uint32_t(h[2]) << 16 | std::uint32_t(h[3]) << 24;
  if (n < 2 || n - 2 > max) return std::nullopt;
  kind = char(h[4]);
  flags = h[5];
  return std::size_t(n - 2);
}

}  // namespace troupe::net
