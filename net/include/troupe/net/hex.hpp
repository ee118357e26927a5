// Bytes <-> lowercase hex, for binary fields inside JSON bodies (constructor arguments).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::net {

inline std::string to_hex(const std::vector<char>& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    auto b = static_cast<unsigned char>(c);
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// Throws std::invalid_argument on odd length or a non-hex character.
inline std::vector<char> from_hex(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw std::invalid_argument("not a hex digit");
  };
  if (text.size() % 2 != 0) throw std::invalid_argument("hex text of odd length");
  std::vector<char> out(text.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(value(text[2 * i]) * 16 + value(text[2 * i + 1]));
  return out;
}

}  // namespace troupe::net
