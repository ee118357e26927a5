// The call messages: calls and replies round-trip (an error's domain and code intact),
// and bad bytes are refused with a clear error, never a crash.
#include <doctest/doctest.h>

#include <algorithm>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/net/frames.hpp"
#include "troupe/net/head_link.hpp"

namespace net = troupe::net;

namespace {

net::CallFrame make_call(std::uint64_t actor, std::uint64_t incarnation, std::uint64_t seq) {
  net::CallFrame c;
  c.actor_id = actor;
  c.incarnation = incarnation;
  c.seq = seq;
  c.method = "echo";
  c.args = {char(seq & 0x7F), 'x', 'y'};
  c.tensors = {{'t', char(seq & 0x7F)}, {}};
  return c;
}

}  // namespace

TEST_CASE("call messages round-trip and bad bytes are refused") {
  auto c = make_call(7, 3, 99);
  auto frame = net::encode_call(c);
  REQUIRE(frame.size() > 5);
  auto back = net::decode_call(frame.data(), frame.size());
  CHECK(back.actor_id == 7);
  CHECK(back.incarnation == 3);
  CHECK(back.seq == 99);
  CHECK(back.method == "echo");
  CHECK(back.args == c.args);
  CHECK(back.tensors == c.tensors);
  // The decoder reads strings and bytes where they lie in the frame, and copies out what it
  // returns: what came back does not change with the frame's bytes.
  std::fill(frame.begin(), frame.end(), char(0x5a));
  CHECK(back.method == "echo");
  CHECK(back.args == c.args);
  CHECK(back.tensors == c.tensors);
  frame = net::encode_call(c);

  net::ReplyFrame r;
  r.actor_id = 1;
  r.seq = 2;
  r.set_error(troupe::Error{troupe::ErrorCode::MethodFailed, "why"});
  r.result = {'a'};
  auto rf = net::encode_reply(r);
  auto rb = net::decode_reply(rf.data(), rf.size());
  CHECK_FALSE(rb.ok());
  CHECK(rb.error_value().code == troupe::ErrorCode::MethodFailed);
  CHECK(rb.error_value().message == "why");
  CHECK(rb.result == r.result);
  std::fill(rf.begin(), rf.end(), char(0x5a));
  CHECK(rb.error_value().message == "why");
  CHECK(rb.result == r.result);
  rf = net::encode_reply(r);

  // Truncated, garbage, a reply where a call is expected, trailing bytes: each a clear error.
  for (std::size_t cut = 0; cut < frame.size(); cut += 3) {
    CHECK_THROWS_AS(net::decode_call(frame.data(), cut), std::runtime_error);
  }
  CHECK_THROWS_AS(net::decode_call(rf.data(), rf.size()), std::runtime_error);
  std::vector<char> trailing(frame.begin(), frame.end());
  trailing.push_back(0);
  CHECK_THROWS_AS(net::decode_call(trailing.data(), trailing.size()), std::runtime_error);
  std::mt19937 rng(42);
  for (int i = 0; i < 200; ++i) {
    std::vector<char> junk(1 + rng() % 64);
    for (auto& b : junk) b = char(rng());
    try {
      net::decode_call(junk.data(), junk.size());
    } catch (const std::runtime_error&) {   // refused; anything else (or a crash) fails the test
    }
  }
}

TEST_CASE("a reply carries its error's domain and code, and a code no domain defines reads as Internal") {
  net::ReplyFrame ok;
  CHECK(ok.ok());
  net::ReplyFrame r;
  r.set_error(troupe::Error{troupe::WeightCode::Rejoin, "group re-formed"});
  auto f = net::encode_reply(r);
  auto back = net::decode_reply(f.data(), f.size());
  CHECK(back.error_value().code == troupe::WeightCode::Rejoin);
  CHECK(back.error_value().message == "group re-formed");

  back.error_domain = 9;   // from a peer with codes this process does not know
  back.error_code = 3;
  auto unknown = back.error_value();
  CHECK(unknown.code == troupe::ErrorCode::Internal);
  CHECK(unknown.message.find("unknown error code 9.3") != std::string::npos);
  back.error_domain = std::uint8_t(troupe::ErrorDomain::Weights);
  back.error_code = 77;
  CHECK(back.error_value().code == troupe::ErrorCode::Internal);
}

TEST_CASE("control messages: nesting past the bound and bodies over it are refused, text that is not UTF-8 is sent as U+FFFD") {
  CHECK(net::json_nesting_within(R"({"a":[[{"b":1}]]})", 4));
  CHECK_FALSE(net::json_nesting_within(R"({"a":[[{"b":1}]]})", 3));
  CHECK(net::json_nesting_within(R"({"a":"[[[[[[[[\"[[[["})", 1));   // brackets in strings, escaped quotes too
  auto body = [](const std::string& text) { return std::vector<char>(text.begin(), text.end()); };
  CHECK(net::decode_control(body(R"({"role":)" + std::string(63, '[') + std::string(63, ']') + "}")).is_object());
  CHECK_THROWS_AS(net::decode_control(body(R"({"role":)" + std::string(100000, '[') + std::string(100000, ']') + "}")),
                  std::runtime_error);
  CHECK_THROWS_AS(net::decode_control(body("[1]")), std::runtime_error);
  CHECK_THROWS_AS(net::decode_control(std::vector<char>(net::kMaxControlMessage + 1, ' ')), std::runtime_error);
  // A failed start's reason naming a package's file, as a node reports it.
  const auto sent = net::encode_control(nlohmann::json{{"status", "cannot unpack 'l\xff/x'"}});
  CHECK(net::decode_control(sent)["status"] == "cannot unpack 'l\xef\xbf\xbd/x'");
  CHECK_THROWS_AS(net::encode_control(nlohmann::json{{"big", std::string(net::kMaxControlMessage, 'x')}}), std::length_error);
}
