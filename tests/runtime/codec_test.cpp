// msgpack encoding of arguments and results: user structs, nesting, tensors, hostile bytes.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <optional>

#include "troupe/codec.hpp"

namespace {

struct Token {
  int id = 0;
  float logprob = 0;
  MSGPACK_DEFINE(id, logprob);
  bool operator==(const Token&) const = default;
};

struct Sample {
  std::string prompt;
  std::vector<Token> tokens;
  std::map<std::string, std::vector<double>> metrics;
  std::optional<std::string> note;
  std::vector<std::vector<Token>> beams;
  MSGPACK_DEFINE_MAP(prompt, tokens, metrics, note, beams);
  bool operator==(const Sample&) const = default;
};

}  // namespace

TEST_CASE("nested user structs survive a msgpack round trip") {
  Sample s{"2+2=", {{4, -0.1f}, {5, -2.5f}}, {{"reward", {1.0, 0.5}}, {"empty", {}}}, "hi",
           {{{1, -1.f}}, {}, {{2, -2.f}, {3, -3.f}}}};
  auto p = troupe::encode_args(s, 42, std::string("x"));
  auto [back, n, str] = troupe::decode_args<Sample, int, std::string>(p);
  CHECK(back == s);
  CHECK(n == 42);
  CHECK(str == "x");
  Sample empty;
  CHECK(troupe::decode_value<Sample>(troupe::encode_value(empty)) == empty);
}

TEST_CASE("per-member results (an elastic group's call_all) travel with each slot's value or error") {
  std::vector<troupe::Result<std::string>> slots{std::string("a"),
                                                 troupe::Error{troupe::ErrorCode::ActorDied, "member 3 died"},
                                                 troupe::Error{troupe::WeightCode::Checksum, "bad bytes"}};
  auto back = troupe::decode_value<std::vector<troupe::Result<std::string>>>(troupe::encode_value(slots));
  REQUIRE(back.size() == 3);
  CHECK(back[0].value() == "a");
  CHECK(back[1].error().code == troupe::ErrorCode::ActorDied);
  CHECK(back[1].error().message == "member 3 died");
  CHECK(back[2].error().code == troupe::WeightCode::Checksum);
  std::vector<troupe::Status> done{troupe::Status{}, troupe::Error{troupe::ErrorCode::Timeout, "late"}};
  auto done_back = troupe::decode_value<std::vector<troupe::Status>>(troupe::encode_value(done));
  REQUIRE(done_back.size() == 2);
  CHECK(done_back[0].ok());
  CHECK(done_back[1].error().code == troupe::ErrorCode::Timeout);
  CHECK_THROWS_AS(troupe::decode_value<std::vector<troupe::Status>>(troupe::encode_value(std::vector<int>{1})), troupe::DecodeError);
}

TEST_CASE("a fresh tensor owns 64-byte aligned bytes: empty's zeroed, uninitialized's left as they are") {
  auto z = troupe::TensorView::empty(troupe::DType::F32, {3, 5});
  auto u = troupe::TensorView::uninitialized(troupe::DType::I64, {7});
  CHECK(u.shape == std::vector<std::int64_t>{7});
  CHECK(u.nbytes() == 56);
  CHECK(u.is_contiguous());
  CHECK(u.keep_alive.get() == u.data);
  CHECK(reinterpret_cast<std::uintptr_t>(u.data) % 64 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(z.data) % 64 == 0);
  for (int i = 0; i < 15; ++i) CHECK(z.data_as<float>()[i] == 0.0f);
  CHECK_THROWS_AS(troupe::TensorView::uninitialized(troupe::DType::F32, {2, -1}), std::invalid_argument);
  CHECK(troupe::TensorView::uninitialized(troupe::DType::U8, {0}).nbytes() == 0);
}

TEST_CASE("a tensor argument travels as a slot, not as bytes") {
  auto t = troupe::TensorView::empty(troupe::DType::BF16, {1024, 1024});
  auto p = troupe::encode_args(t, 1);
  CHECK(p.bytes.size() < 32);          // the 2 MiB stay out of the message
  REQUIRE(p.tensors.size() == 1);
  auto [back, one] = troupe::decode_args<troupe::TensorView, int>(p);
  CHECK(back.data == t.data);
  CHECK(back.dtype == troupe::DType::BF16);
  CHECK(back.shape == std::vector<std::int64_t>{1024, 1024});
  CHECK(back.keep_alive.get() == t.keep_alive.get());
}

TEST_CASE("a tensor slot outside the table is rejected") {
  auto t = troupe::TensorView::empty(troupe::DType::F32, {4});
  auto p = troupe::encode_args(t);
  p.tensors.clear();
  CHECK_THROWS_AS(troupe::decode_args<troupe::TensorView>(p), troupe::DecodeError);
}

TEST_CASE("hostile bytes fail with DecodeError, never a huge allocation") {
  troupe::Payload p;
  p.bytes = {char(0xdd), char(0x7f), char(0xff), char(0xff), char(0xff)};   // array32 of 2^31-1
  CHECK_THROWS_AS(troupe::decode_args<int>(p), troupe::DecodeError);
  p.bytes = {char(0xc1)};
  CHECK_THROWS_AS(troupe::decode_args<int>(p), troupe::DecodeError);
  p.bytes.assign(200, char(0x91));   // 200 nested one-element arrays
  CHECK_THROWS_AS(troupe::decode_args<int>(p), troupe::DecodeError);
  p.bytes.clear();
  CHECK_THROWS_AS(troupe::decode_args<int>(p), troupe::DecodeError);
  auto good = troupe::encode_args(std::string(64, 'a'));
  good.bytes.pop_back();
  CHECK_THROWS_AS(troupe::decode_args<std::string>(good), troupe::DecodeError);
}

TEST_CASE("arity and type mismatches fail with DecodeError") {
  auto p = troupe::encode_args(1, 2);
  CHECK_THROWS_AS((troupe::decode_args<int>(p)), troupe::DecodeError);
  CHECK_THROWS_AS((troupe::decode_args<int, int, int>(p)), troupe::DecodeError);
  CHECK_THROWS_AS((troupe::decode_args<std::string, int>(p)), troupe::DecodeError);
  CHECK_NOTHROW((troupe::decode_args<double, long>(p)));   // numeric widening is allowed
}

TEST_CASE("tensor views report sizes and contiguity") {
  auto t = troupe::TensorView::empty(troupe::DType::F16, {3, 5});
  CHECK(t.numel() == 15);
  CHECK(t.nbytes() == 30);
  CHECK(t.is_contiguous());
  auto v = troupe::TensorView::wrap(t.data, troupe::DType::F16, {5, 3}, t.keep_alive, {1, 5});
  CHECK_FALSE(v.is_contiguous());
  CHECK(troupe::dtype_name(troupe::DType::BF16) == "bf16");
  CHECK_FALSE(troupe::dtype_valid(200));
}
