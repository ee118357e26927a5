#include <random>

#include "placement_test_util.hpp"

using namespace troupe::placement;
using troupe::PlacementCode;
using troupe::placement::test::res;

TEST_CASE("resource strings parse into exact fixed-point quantities") {
  auto r = Resources::parse("CPU=4,GPU=1,memory=16G,accel_type:H200=1");
  REQUIRE(r.ok());
  CHECK(r->get(kCpu) == Quantity::whole(4));
  CHECK(r->get(kGpu) == Quantity::whole(1));
  CHECK(r->get(kMemory) == Quantity::whole(std::int64_t{16} << 30));
  CHECK(r->get("accel_type:H200") == Quantity::whole(1));
  CHECK(res(" CPU = 0.5 , GPU=0.25 ").get(kCpu).units() == 5000);
  CHECK(res("memory=1.5Gi").get(kMemory) == Quantity::whole(std::int64_t{3} << 29));
  CHECK(res("").empty());
  CHECK(res("CPU=0").empty());
}

TEST_CASE("resources print canonically and round-trip through parse") {
  CHECK(res("accel_type:H200=1,memory=16G,GPU=1,CPU=4").to_string() == "CPU=4,GPU=1,memory=16G,accel_type:H200=1");
  CHECK(res("memory=1536M").to_string() == "memory=1536M");
  CHECK(res("memory=1000").to_string() == "memory=1000");
  CHECK(res("GPU=0.0001,CPU=12.5").to_string() == "CPU=12.5,GPU=0.0001");
  std::mt19937_64 rng(7);
  for (int i = 0; i < 500; ++i) {
    Resources r;
    r.set(kCpu, Quantity::from_units(rng() % 1'000'000));
    r.set(kGpu, Quantity::from_units(rng() % 80'000));
    r.set(kMemory, Quantity::whole(static_cast<std::int64_t>(rng() % 4096) << 20));
    r.set("custom_" + std::to_string(rng() % 5), Quantity::from_units(rng() % 99'999));
    auto back = Resources::parse(r.to_string());
    REQUIRE(back.ok());
    CHECK(*back == r);
  }
}

TEST_CASE("fixed-point sums are exact: ten 0.1 GPU make exactly 1 GPU") {
  Resources sum;
  for (int i = 0; i < 10; ++i) sum += res("GPU=0.1");
  CHECK(sum == res("GPU=1"));
  CHECK(Quantity::from_double(0.1).units() == 1000);
  // Property: the sum of many parsed decimals equals the integer sum of their digits.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    Resources total;
    std::int64_t expected = 0;
    for (int i = 0; i < 100; ++i) {
      const std::int64_t units = static_cast<std::int64_t>(rng() % 100'000);
      expected += units;
      const std::string text = "CPU=" + std::to_string(units / 10000) + "." + std::to_string(units % 10000 + 10000).substr(1);
      total += res(text);
    }
    CHECK(total.get(kCpu).units() == expected);
    Resources back = total;
    for (int i = 0; i < 3; ++i) back -= res("CPU=0.0001");
    CHECK(back.get(kCpu).units() == expected - 3);
  }
}

TEST_CASE("malformed resource strings are clear errors") {
  struct Case { const char* text; const char* says; };
  const Case cases[] = {
      {"CPU", "expected name=value"},        {"CPU=abc", "not a non-negative number"},
      {"CPU=-1", "not a non-negative number"}, {"CPU=1,", "empty item"},
      {"CPU=1,CPU=2", "given twice"},        {"CPU=0.00001", "finer than 0.0001"},
      {"memory=4X", "unknown suffix"},       {"1CPU=1", "bad name"},
      {"CPU=1.", "no digits after"},         {"CPU=99999999999999999999", "too large"},
      {"=3", "bad name"},
  };
  for (const Case& c : cases) {
    auto r = Resources::parse(c.text);
    INFO(c.text);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == PlacementCode::InvalidArgument);
    CHECK(r.error().message.find(c.says) != std::string::npos);
    CHECK(r.error().message.find(c.text) != std::string::npos);
  }
  CHECK_THROWS_AS(Resources::must_parse("GPU=x"), std::invalid_argument);
}

TEST_CASE("fits_in compares every name and treats a missing name as zero") {
  CHECK(res("CPU=2").fits_in(res("CPU=2,GPU=1")));
  CHECK_FALSE(res("CPU=2,GPU=0.1").fits_in(res("CPU=8")));
  CHECK(res("").fits_in(res("")));
  CHECK((res("CPU=2,GPU=1") - res("CPU=2,GPU=1")).empty());
  CHECK((res("CPU=1") - res("CPU=2")).any_negative());
  CHECK(res("GPU=1").names_subset_of(res("CPU=1,GPU=2")));
  CHECK_FALSE(res("foo=1").names_subset_of(res("CPU=1")));
}

TEST_CASE("strategies parse from Ray's names and reject others") {
  CHECK(*parse_strategy("STRICT_SPREAD") == Strategy::kStrictSpread);
  CHECK(to_string(Strategy::kStrictPack) == "STRICT_PACK");
  auto bad = parse_strategy("SPREADISH");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("SPREADISH") != std::string::npos);
}
