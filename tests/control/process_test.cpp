// prefetch_program: the files it reads ahead are the ones the dynamic loader loads, and no file
// (a job's binary is the user's bytes) makes it fail.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>

#include "support/temp_dir.hpp"
#include "troupe/control/process.hpp"

namespace fs = std::filesystem;
using troupe::control::prefetch_program;

namespace {

std::string canonical(const std::string& p) {
  std::error_code ec;
  return fs::weakly_canonical(p, ec).string();
}

// What ld.so itself loads for `exe` (LD_TRACE_LOADED_OBJECTS: it lists them and runs nothing).
std::set<std::string> loader_files(const std::string& exe) {
  std::set<std::string> out;
  FILE* p = ::popen(("LD_TRACE_LOADED_OBJECTS=1 '" + exe + "'").c_str(), "r");
  REQUIRE(p != nullptr);
  char line[4096];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::string l(line);
    const auto arrow = l.find("=> ");
    const auto from = arrow != std::string::npos ? arrow + 3 : l.find('/');
    if (from == std::string::npos || from >= l.size() || l[from] != '/') continue;   // linux-vdso.so.1
    out.insert(canonical(l.substr(from, l.find(" (", from) - from)));
  }
  ::pclose(p);
  return out;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

}  // namespace

TEST_CASE("prefetch_program reads ahead a program's binary and exactly the libraries the loader loads") {
  const std::string exe = canonical(fs::read_symlink("/proc/self/exe").string());
  const auto got = prefetch_program(exe);
  REQUIRE(!got.files.empty());
  CHECK(got.files.front() == exe);
  std::set<std::string> libraries(got.files.begin() + 1, got.files.end());
  CHECK(libraries.size() == got.files.size() - 1);   // each once
  CHECK(libraries == loader_files(exe));
  std::uint64_t bytes = 0;
  for (const auto& f : got.files) bytes += fs::file_size(f);
  CHECK(got.bytes == bytes);

  // A name without '/' is looked up in the PATH given, as execvp does.
  const auto sh = prefetch_program("sh", "", "/nonexistent:/usr/bin:/bin");
  REQUIRE(!sh.files.empty());
  CHECK(sh.files.front() == canonical("/bin/sh"));
  CHECK(std::set<std::string>(sh.files.begin() + 1, sh.files.end()) == loader_files("/bin/sh"));
  CHECK(prefetch_program("sh", "", "").files.empty());
  CHECK(prefetch_program("/nonexistent/program").files.empty());
}

TEST_CASE("prefetch_program reads a file that is no ELF, a cut one or a corrupted one as itself, and fails on none") {
  test_support::TempDir dir("troupe-prefetch");
  const std::string text = dir.path + "/script";
  write(text, "#!/bin/sh\necho hi\n");
  auto got = prefetch_program(text);
  REQUIRE(got.files.size() == 1);
  CHECK(got.bytes == 18);

  const std::string exe = bytes_of("/proc/self/exe");
  REQUIRE(exe.size() > 4096);
  const std::string cut = dir.path + "/cut";
  for (std::size_t n : {std::size_t(0), std::size_t(10), std::size_t(64), std::size_t(100), std::size_t(4096)}) {
    write(cut, exe.substr(0, n));
    got = prefetch_program(cut);
    CHECK(got.files.size() == 1);
  }
  // Flipped bytes in the headers and the dynamic section's neighbourhood: whatever the walk finds
  // (a library still named right), it ends, and it names no file twice.
  std::mt19937 rng(7);
  const std::string bad = dir.path + "/bad";
  const std::size_t span = std::min<std::size_t>(exe.size(), 64u << 10);
  for (int round = 0; round < 200; ++round) {
    std::string b = exe.substr(0, span);
    for (int k = 0; k < 8; ++k) b[rng() % (round % 2 == 0 ? 128 : span)] = char(rng());
    write(bad, b);
    got = prefetch_program(bad, dir.path);
    REQUIRE(!got.files.empty());
    CHECK(got.files.front() == canonical(bad));
    CHECK(std::set<std::string>(got.files.begin(), got.files.end()).size() == got.files.size());
  }
}
