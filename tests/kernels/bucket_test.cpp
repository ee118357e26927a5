#include "troupe/kernels/bucket.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <doctest/doctest.h>

#include "reference.hpp"

namespace tk = troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

std::vector<std::byte> poisoned_bucket(std::size_t n) { return std::vector<std::byte>(n, std::byte{0xAB}); }

// The largest |x| in each row, for the int8 error bound.
std::vector<double> row_amax(const std::vector<float>& x, std::int64_t rows, std::int64_t cols) {
  std::vector<double> m(std::size_t(rows), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) m[std::size_t(r)] = std::max(m[std::size_t(r)], double(std::fabs(x[std::size_t(r * cols + c)])));
  return m;
}

// Packs fp32 tensors with the given wire formats, unpacks into fresh NaN buffers, checks each
// element against the format's bound from bucket.hpp.
void round_trip(const std::vector<tk::TensorSpec>& specs, std::uint64_t seed) {
  tk::BucketLayout layout;
  REQUIRE(tk::plan_bucket(specs, &layout).ok());
  std::vector<std::vector<float>> src, dst;
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const auto& s : specs) {
    src.push_back(normal(std::size_t(s.numel()), 2.0f, seed++));
    dst.push_back(poisoned(std::size_t(s.numel())));
  }
  for (std::size_t i = 0; i < specs.size(); ++i) in.push_back(src[i].data()), out.push_back(dst[i].data());
  auto bucket = poisoned_bucket(layout.bytes);
  REQUIRE(tk::pack_bucket(layout, in, bucket.data()).ok());
  REQUIRE(tk::unpack_bucket(layout, bucket.data(), out).ok());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    CAPTURE(s.name);
    const auto amax = row_amax(src[i], s.rows, s.cols);
    for (std::int64_t j = 0; j < s.numel(); ++j) {
      const double x = src[i][std::size_t(j)], y = dst[i][std::size_t(j)];
      const double bound = s.wire == tk::WireFormat::kF32    ? 0.0
                           : s.wire == tk::WireFormat::kBF16 ? std::ldexp(std::fabs(x), -8)
                                                             : amax[std::size_t(j / s.cols)] / 254.0 * 1.0001;
      if (!(std::fabs(x - y) <= bound)) {
        INFO("element " << j << ": " << x << " -> " << y);
        CHECK(std::fabs(x - y) <= bound);
        break;
      }
    }
  }
  // Padding is zeroed: repacking into a differently poisoned buffer gives the same bytes.
  auto again = std::vector<std::byte>(layout.bytes, std::byte{0x5C});
  REQUIRE(tk::pack_bucket(layout, in, again.data()).ok());
  CHECK(std::memcmp(bucket.data(), again.data(), layout.bytes) == 0);
}

}  // namespace

TEST_CASE("plan_bucket aligns entries and rejects repeated or empty names") {
  const std::vector<tk::TensorSpec> specs{{"a", 3, 5, tk::DType::kF32, tk::WireFormat::kF32},
                                          {"b", 7, 9, tk::DType::kF32, tk::WireFormat::kInt8Row},
                                          {"c", 1, 1, tk::DType::kBF16, tk::WireFormat::kBF16}};
  tk::BucketLayout layout;
  REQUIRE(tk::plan_bucket(specs, &layout).ok());
  REQUIRE(layout.entries.size() == 3);
  CHECK(layout.entries[0].bytes == 60);
  CHECK(layout.entries[1].offset == tk::kBucketAlign);
  CHECK(layout.entries[1].data_offset == 32);  // 7 scales, padded to 16 bytes
  CHECK(layout.entries[1].bytes == 32 + 63);
  CHECK(layout.entries[2].offset == 2 * tk::kBucketAlign);
  CHECK(layout.bytes == 3 * tk::kBucketAlign);
  REQUIRE(layout.find("b") != nullptr);
  CHECK(layout.find("b")->spec.cols == 9);
  CHECK(layout.find("zz") == nullptr);
  auto dup = specs;
  dup[2].name = specs[0].name;
  CHECK(tk::plan_bucket(dup, &layout).error().code == tk::KernelCode::BadArguments);
  dup[2].name.clear();
  CHECK(tk::plan_bucket(dup, &layout).error().code == tk::KernelCode::BadArguments);
}

TEST_CASE("fp32, bf16 and int8 buckets round-trip within each format's bound") {
  round_trip({{"embed", 100, 64, tk::DType::kF32, tk::WireFormat::kBF16},
              {"w_q", 33, 129, tk::DType::kF32, tk::WireFormat::kInt8Row},
              {"norm", 1, 77, tk::DType::kF32, tk::WireFormat::kF32},
              {"empty", 0, 16, tk::DType::kF32, tk::WireFormat::kInt8Row},
              {"bias", 1, 1000, tk::DType::kF32, tk::WireFormat::kInt8Row}},
             1);
}

TEST_CASE("a large bucket is packed by several threads with the same result") {
  round_trip({{"big_a", 1024, 1024, tk::DType::kF32, tk::WireFormat::kInt8Row},
              {"big_b", 512, 2048, tk::DType::kF32, tk::WireFormat::kBF16},
              {"big_c", 3, 300000, tk::DType::kF32, tk::WireFormat::kF32}},
             2);
}

TEST_CASE("bf16 tensors travel exactly as bf16 and quantise from bf16 to int8") {
  const std::int64_t rows = 9, cols = 50;
  std::vector<tk::bf16> a, b;
  for (float v : normal(std::size_t(rows * cols), 1.0f, 3)) a.push_back(tk::to_bf16(v)), b.push_back(tk::to_bf16(-v));
  b[10] = tk::to_bf16(0.0f);
  const std::vector<tk::TensorSpec> specs{{"a", rows, cols, tk::DType::kBF16, tk::WireFormat::kBF16},
                                          {"b", rows, cols, tk::DType::kBF16, tk::WireFormat::kInt8Row}};
  tk::BucketLayout layout;
  REQUIRE(tk::plan_bucket(specs, &layout).ok());
  auto bucket = poisoned_bucket(layout.bytes);
  const std::vector<const void*> in{a.data(), b.data()};
  REQUIRE(tk::pack_bucket(layout, in, bucket.data()).ok());
  std::vector<tk::bf16> a2(a.size(), tk::bf16{0x7fc0}), b2(b.size(), tk::bf16{0x7fc0});
  const std::vector<void*> out{a2.data(), b2.data()};
  REQUIRE(tk::unpack_bucket(layout, bucket.data(), out).ok());
  CHECK(std::memcmp(a.data(), a2.data(), a.size() * 2) == 0);
  std::vector<float> bf;
  for (auto v : b) bf.push_back(tk::to_float(v));
  const auto amax = row_amax(bf, rows, cols);
  for (std::size_t i = 0; i < b.size(); ++i) {
    // int8 step plus the bf16 rounding of the dequantised value
    const double bound = amax[i / cols] / 254.0 * 1.0001 + std::ldexp(amax[i / cols], -8);
    CHECK(std::fabs(tk::to_float(b2[i]) - bf[i]) <= bound);
  }
}

TEST_CASE("an all-zero row quantises to zeros with scale 0") {
  const std::vector<float> x(2 * 8, 0.0f);
  const std::vector<tk::TensorSpec> specs{{"z", 2, 8, tk::DType::kF32, tk::WireFormat::kInt8Row}};
  tk::BucketLayout layout;
  REQUIRE(tk::plan_bucket(specs, &layout).ok());
  auto bucket = poisoned_bucket(layout.bytes);
  auto y = poisoned(16);
  REQUIRE(tk::pack_bucket(layout, std::vector<const void*>{x.data()}, bucket.data()).ok());
  REQUIRE(tk::unpack_bucket(layout, bucket.data(), std::vector<void*>{y.data()}).ok());
  float scale = 1.0f;
  std::memcpy(&scale, bucket.data(), 4);
  CHECK(scale == 0.0f);
  for (float v : y) CHECK(v == 0.0f);
}

TEST_CASE("pack_bucket rejects a tensor count that does not match the layout") {
  const std::vector<tk::TensorSpec> specs{{"a", 1, 4, tk::DType::kF32, tk::WireFormat::kF32}};
  tk::BucketLayout layout;
  REQUIRE(tk::plan_bucket(specs, &layout).ok());
  auto bucket = poisoned_bucket(layout.bytes);
  CHECK(tk::pack_bucket(layout, std::vector<const void*>{}, bucket.data()).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::pack_bucket(layout, std::vector<const void*>{nullptr}, bucket.data()).error().code ==
        tk::KernelCode::BadArguments);
  CHECK(bucket[0] == std::byte{0xAB});
}
