#include "troupe/net/address.hpp"

#include <stdexcept>

namespace troupe::net {

std::pair<std::string, std::uint16_t> split_address(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw std::invalid_argument("address '" + address + "' is not HOST:PORT");
  }
  std::string port_text = address.substr(colon + 1);
  std::size_t used = 0;
  long port = -1;
  try { port = std::stol(port_text, &used); } catch (const std::exception&) { used = 0; }
  if (used != port_text.size() || port <= 0 || port > 65535) {
    throw std::invalid_argument("address '" + address + "': port must be 1..65535");
  }
  return {address.substr(0, colon), static_cast<std::uint16_t>(port)};
}

}  // namespace troupe::net
