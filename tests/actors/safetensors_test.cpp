// safetensors: round trips and rejection of malformed files (actors/safetensors.hpp).
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/safetensors.hpp"

using troupe::DType;
using troupe::TensorView;
using namespace troupe::actors;

namespace {

TensorView iota_f32(std::vector<std::int64_t> shape) {
  auto t = TensorView::empty(DType::F32, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = float(i) * 0.5f;
  return t;
}

// A file: 8-byte length, then `header` verbatim, then `data_bytes` zero bytes.
std::vector<char> raw_file(const std::string& header, std::size_t data_bytes) {
  std::vector<char> out(8 + header.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[i] = char((std::uint64_t(header.size()) >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string error_of(const std::vector<char>& bytes) {
  try {
    parse_safetensors(bytes);
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a safetensors file round-trips dtypes, shapes, values and metadata") {
  auto a = iota_f32({2, 3});
  auto b = TensorView::empty(DType::I64, {4});
  for (int i = 0; i < 4; ++i) b.data_as<std::int64_t>()[i] = -7 + i;
  auto c = TensorView::empty(DType::Bool, {3});
  c.data_as<bool>()[1] = true;
  auto empty = TensorView::empty(DType::F32, {0, 5});
  auto bytes = serialize_safetensors({{"a", a}, {"b", b}, {"c", c}, {"empty", empty}}, {{"version", "7"}});
  auto file = parse_safetensors(bytes);
  REQUIRE(file.tensors.size() == 4);
  CHECK(file.metadata.at("version") == "7");
  const auto& ra = file.require("a", {2, 3});
  CHECK(ra.dtype == DType::F32);
  for (int i = 0; i < 6; ++i) CHECK(ra.data_as<float>()[i] == float(i) * 0.5f);
  CHECK(file.require("b", {4}).data_as<std::int64_t>()[0] == -7);
  CHECK(file.require("c", {3}).data_as<bool>()[1]);
  CHECK(file.require("empty", {0, 5}).numel() == 0);
  CHECK(file.find("missing") == nullptr);
  CHECK_THROWS_AS(file.require("a", {3, 2}), SafetensorsError);
}

TEST_CASE("the data section starts 8-byte aligned and the header names the documented dtype tags") {
  auto bytes = serialize_safetensors({{"x", iota_f32({3})}});
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(std::uint8_t(bytes[i])) << (8 * i);
  CHECK((8 + n) % 8 == 0);
  std::string header(bytes.data() + 8, n);
  CHECK(header.find("\"dtype\":\"F32\"") != std::string::npos);
  CHECK(header.find("\"data_offsets\":[0,12]") != std::string::npos);
}

TEST_CASE("a file written by the reference implementation's layout is read") {
  // Layout as huggingface/safetensors writes it: {"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";
  auto bytes = raw_file(header, 8);
  float v[2] = {1.5f, -2.0f};
  std::memcpy(bytes.data() + 8 + header.size(), v, 8);
  auto file = parse_safetensors(bytes);
  CHECK(file.metadata.at("format") == "pt");
  CHECK(file.require("w", {2}).data_as<float>()[1] == -2.0f);
}

TEST_CASE("strided views are written contiguous") {
  auto base = iota_f32({2, 3});
  // The transpose [3, 2] of base: strides (1, 3).
  auto t = TensorView::wrap(base.data, DType::F32, {3, 2}, base.keep_alive, {1, 3});
  auto file = parse_safetensors(serialize_safetensors({{"t", t}}));
  const float* out = file.require("t", {3, 2}).data_as<float>();
  const float expected[6] = {0.0f, 1.5f, 0.5f, 2.0f, 1.0f, 2.5f};
  for (int i = 0; i < 6; ++i) CHECK(out[i] == expected[i]);
}

TEST_CASE("a truncated file is rejected with an error naming the problem") {
  auto bytes = serialize_safetensors({{"a", iota_f32({4})}, {"b", iota_f32({2})}});
  auto cut = std::vector<char>(bytes.begin(), bytes.end() - 3);
  CHECK(error_of(cut).find("outside the") != std::string::npos);
  CHECK(error_of(std::vector<char>(bytes.begin(), bytes.begin() + 20)).find("runs past the end") != std::string::npos);
  CHECK(error_of(std::vector<char>(bytes.begin(), bytes.begin() + 5)).find("too short") != std::string::npos);
}

TEST_CASE("malformed headers are rejected") {
  CHECK(error_of(raw_file("[1,2]", 0)).find("not a JSON object") != std::string::npos);
  CHECK(error_of(raw_file("{\"a\":", 0)).find("not valid JSON") != std::string::npos);
  CHECK(error_of(raw_file(R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1)).find("unsupported dtype") != std::string::npos);
  CHECK(error_of(raw_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)).find("non-natural") != std::string::npos);
  CHECK(error_of(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4)).find("4 bytes for a shape of 2") != std::string::npos);
  CHECK(error_of(raw_file(R"({"a":{"dtype":"F32","shape":[1]}})", 4)).find("missing data_offsets") != std::string::npos);
  CHECK(error_of(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4)).find("outside") != std::string::npos);
  CHECK(error_of(raw_file(R"({"__metadata__":{"k":1}})", 0)).find("not a string") != std::string::npos);
}

TEST_CASE("overlapping, gapped or unowned byte ranges are rejected") {
  const char* overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  CHECK(error_of(raw_file(overlap, 8)).find("overlap or leave a gap") != std::string::npos);
  const char* gap = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  CHECK(error_of(raw_file(gap, 8)).find("overlap or leave a gap") != std::string::npos);
  const char* tail = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  CHECK(error_of(raw_file(tail, 8)).find("4 bytes no tensor owns") != std::string::npos);
}

TEST_CASE("a header length beyond the limit is rejected before any allocation") {
  std::vector<char> bytes(16, ' ');
  std::uint64_t n = kMaxSafetensorsHeader + 1;
  for (int i = 0; i < 8; ++i) bytes[i] = char((n >> (8 * i)) & 0xff);
  CHECK(error_of(bytes).find("exceeds the limit") != std::string::npos);
}

TEST_CASE("repeated or empty tensor names cannot be written") {
  auto a = iota_f32({1});
  CHECK_THROWS_AS(serialize_safetensors({{"a", a}, {"a", a}}), SafetensorsError);
  CHECK_THROWS_AS(serialize_safetensors({{"", a}}), SafetensorsError);
}

TEST_CASE("files are written atomically and read back, and a missing file names its path") {
  auto dir = std::filesystem::temp_directory_path() / ("troupe_safetensors_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "w.safetensors").string();
  write_safetensors(path, {{"x", iota_f32({5})}});
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  CHECK(read_safetensors(path).require("x", {5}).data_as<float>()[4] == 2.0f);
  try {
    read_safetensors((dir / "nope.safetensors").string());
    FAIL("expected an error");
  } catch (const SafetensorsError& e) {
    CHECK(std::string(e.what()).find("nope.safetensors") != std::string::npos);
  }
  // A directory (a checkpoint's, given as a weights file) is refused by name: ifstream opened it
  // and its size read as 2^63 - 1, a bad_alloc.
  try {
    read_safetensors(dir.string());
    FAIL("expected an error");
  } catch (const SafetensorsError& e) {
    CHECK(std::string(e.what()).find(dir.string()) != std::string::npos);
  }
  // Writers of one path, at once: each writes a file of its own and renames it, so the path always
  // holds one writer's file whole, and no temporary file stays behind.
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < 10; ++i) write_safetensors(path, {{"x", iota_f32({5 + 100 * w})}}, {{"writer", std::to_string(w)}});
    });
  }
  for (auto& t : writers) t.join();
  const auto last = read_safetensors(path);
  const int w = std::stoi(last.metadata.at("writer"));
  CHECK(last.require("x", {5 + 100 * w}).data_as<float>()[4] == 2.0f);
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
  std::filesystem::remove_all(dir);
}
