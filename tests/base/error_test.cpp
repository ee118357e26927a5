// troupe::Error: codes of every domain compare as codes, render with their domain, survive the
// wire's (domain, value) pair, and Result/TROUPE_RETURN_IF_ERROR carry them unchanged.
#include <doctest/doctest.h>

#include <string>

#include "troupe/error.hpp"
#include "troupe/ids.hpp"
#include "troupe/named_registry.hpp"

using troupe::Code;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Result;
using troupe::Status;

namespace {

Result<int> half(int x) {
  if (x % 2 != 0) return {troupe::PlacementCode::InvalidArgument, std::to_string(x) + " is odd"};
  return x / 2;
}

Result<int> quarter(int x) {
  auto h = half(x);
  TROUPE_RETURN_IF_ERROR(h);
  return half(*h);
}

Status check_even(int x) {
  TROUPE_RETURN_IF_ERROR(half(x));
  return {};
}

}  // namespace

TEST_CASE("codes of different domains never compare equal, and each renders with its domain") {
  Code died = ErrorCode::ActorDied;
  CHECK(died == ErrorCode::ActorDied);
  CHECK(died != ErrorCode::Timeout);
  CHECK(Code(troupe::WeightCode::NotFound) != Code(troupe::PlacementCode::NotFound));
  CHECK(Code(troupe::WeightCode::NotFound).domain() == troupe::ErrorDomain::Weights);
  CHECK(troupe::to_string(died) == "ActorDied");
  CHECK(troupe::to_string(Code(troupe::WeightCode::NotFound)) == "weights.NotFound");
  CHECK(Error{troupe::TransportCode::PeerGone, "pid 7"}.to_string() == "transport.PeerGone: pid 7");
  CHECK(Error{ErrorCode::Timeout, "counter#1.add took longer than 50 ms"}.to_string() ==
        "Timeout: counter#1.add took longer than 50 ms");
  CHECK(Code{} == ErrorCode::Internal);   // a default Error is a bug, never a success
}

TEST_CASE("codes read from the wire keep their domain, and pairs no domain defines become Internal") {
  for (Code c : {Code(ErrorCode::Cancelled), Code(troupe::KernelCode::DeviceError), Code(troupe::NetCode::Unreachable),
                 Code(troupe::ControlCode::Store), Code(troupe::PlacementCode::FailedPrecondition)}) {
    CHECK(Code::from_wire(std::uint8_t(c.domain()), c.value()) == c);
  }
  CHECK(Code::from_wire(200, 1) == ErrorCode::Internal);
  CHECK(Code::from_wire(std::uint8_t(troupe::ErrorDomain::Weights), 0) == ErrorCode::Internal);
  CHECK(Code::from_wire(std::uint8_t(troupe::ErrorDomain::Weights), 99) == ErrorCode::Internal);
}

TEST_CASE("Result and TROUPE_RETURN_IF_ERROR pass an error on unchanged") {
  CHECK(*quarter(8) == 2);
  auto odd = quarter(6);   // 6 -> 3 -> odd
  REQUIRE_FALSE(odd.ok());
  CHECK(odd.error().code == troupe::PlacementCode::InvalidArgument);
  CHECK(odd.error().message == "3 is odd");
  CHECK(check_even(4).ok());
  CHECK(check_even(5).error().message == "5 is odd");
  try {
    (void)odd.value();
    FAIL("value() of an error returned");
  } catch (const troupe::CallError& e) {
    CHECK(e.code() == troupe::PlacementCode::InvalidArgument);
  }
}

TEST_CASE("a named registry finds what was put, and names what it lacks") {
  troupe::NamedRegistry<int> r("widget");
  r.put("a", 1);
  r.slot("b") += 2;
  CHECK(*r.find("a") == 1);
  CHECK(r.at("b") == 2);
  CHECK(r.find("c") == nullptr);
  try {
    (void)r.at("c");
    FAIL("found an entry never put");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "no widget registered as 'c' (known: a, b)");
  }
}

TEST_CASE("actor labels: in-process and cluster actors are named alike, by name or type and a short number") {
  CHECK(troupe::actor_label("Counter", 3) == "Counter#3");
  CHECK(troupe::actor_label("Counter", troupe::kClusterActorBase + 3) == "Counter#3");
  CHECK(troupe::actor_number(troupe::kClusterActorBase) == 0);
  CHECK(troupe::actor_number(17) == 17);
}
