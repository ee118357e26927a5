#include "troupe/net/token.hpp"

#include <random>

namespace troupe::net {

std::string random_token() {
  std::random_device rd;   // /dev/urandom on Linux
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 32; ++i) out += kHex[rd() & 15];
  return out;
}

bool token_matches(const std::string& given, const std::string& expected) {
  if (given.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  return diff == 0;
}

}  // namespace troupe::net
