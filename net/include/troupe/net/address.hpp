// Addresses of troupe processes: "host:port" text, as flags, the store and the CLI write them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace troupe::net {

// "host:port" -> parts. Throws std::invalid_argument with a clear message.
std::pair<std::string, std::uint16_t> split_address(const std::string& address);

}  // namespace troupe::net
