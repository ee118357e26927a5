// Addresses as flags and the store write them: "host:port", anything else refused clearly.
#include <doctest/doctest.h>

#include <stdexcept>

#include "troupe/net/address.hpp"

namespace net = troupe::net;

TEST_CASE("split_address rejects malformed addresses") {
  CHECK(net::split_address("127.0.0.1:6380").second == 6380);
  CHECK_THROWS_AS(net::split_address("127.0.0.1"), std::invalid_argument);
  CHECK_THROWS_AS(net::split_address("h:0"), std::invalid_argument);
  CHECK_THROWS_AS(net::split_address("h:70000"), std::invalid_argument);
  CHECK_THROWS_AS(net::split_address("h:12x"), std::invalid_argument);
}
