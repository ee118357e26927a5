// prefetch_program: the files it reads ahead are the ones the dynamic loader loads, and no file
// (a job's binary is the user's bytes) makes it fail.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "support/skip.hpp"
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
  FILE* p = ::popen(("env -u LD_PRELOAD LD_TRACE_LOADED_OBJECTS=1 '" + exe + "'").c_str(), "r");
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

std::string env(const char* key) {
  const char* v = std::getenv(key);
  return v ? v : "";
}

// Whether f() returns true within `limit`, run in a child process (a hang or a blow-up there
// fails the check instead of the test run).
bool holds_within(const std::function<bool()>& f, std::chrono::seconds limit) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(f() ? 0 : 1);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

TEST_CASE("prefetch_program reads ahead a program's binary and exactly the libraries the loader loads") {
  const std::string exe = canonical(fs::read_symlink("/proc/self/exe").string());
  const auto got = prefetch_program(exe, env("LD_LIBRARY_PATH"));
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
  // A small program, whole, with flipped bytes (its headers, dynamic section and string table
  // among them): whatever the walk finds, it ends and names no file twice.
  const std::string small = bytes_of("/bin/true");
  REQUIRE(small.size() > 1024);
  std::mt19937 rng(7);
  const std::string bad = dir.path + "/bad";
  for (int round = 0; round < 1000; ++round) {
    std::string b = small;
    for (int k = 0; k < 4; ++k) b[rng() % (round % 4 == 0 ? 64 : b.size())] = char(rng());
    write(bad, b);
    got = prefetch_program(bad, dir.path);
    REQUIRE(!got.files.empty());
    CHECK(got.files.front() == canonical(bad));
    CHECK(std::set<std::string>(got.files.begin(), got.files.end()).size() == got.files.size());
  }
}

TEST_CASE("prefetch_program reads a program whose header claims too many sections as itself, without parsing it") {
  // libelf allocates for every section a header claims before reading anything: such a header
  // (65,535 sections, or extended numbering's count in section 0) is refused before libelf sees it.
  test_support::TempDir dir("troupe-prefetch");
  const std::string small = bytes_of("/bin/true");
  REQUIRE(small.size() > 64);
  const std::string path = dir.path + "/program";
  write(path, small);
  CHECK(prefetch_program(path).files.size() > 1);   // itself and the libraries it needs
  constexpr std::size_t kShnum = 60;                  // Elf64_Ehdr::e_shnum
  for (std::uint16_t shnum : {std::uint16_t(0xffff), std::uint16_t(0)}) {   // 0 with e_shoff set: extended numbering
    std::string b = small;
    std::memcpy(b.data() + kShnum, &shnum, sizeof shnum);
    write(path, b);
    const auto got = prefetch_program(path);
    REQUIRE(got.files.size() == 1);
    CHECK(got.files.front() == canonical(path));
  }
}

TEST_CASE("prefetch_program opens no FIFO named as the program") {
  test_support::TempDir dir("troupe-prefetch");
  const std::string fifo = dir.path + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(holds_within([&] { return prefetch_program(fifo).files.empty(); }, std::chrono::seconds(20)));
}

TEST_CASE("prefetch_program expands $ORIGIN once and passes over a FIFO named as a library, in a directory named $ORIGIN") {
  test_support::TempDir dir("troupe-prefetch");
  // This test program with its RUNPATH (the build's lib directory) rewritten to "$ORIGIN", copied
  // into a directory named "$ORIGIN" that holds a FIFO under the name of its first library.
  const std::string exe = canonical(fs::read_symlink("/proc/self/exe").string());
  std::string bytes = bytes_of(exe);
  const std::string runpath = (fs::path(exe).parent_path().parent_path() / "lib").string();
  const auto at = bytes.find(runpath + '\0');
  if (at == std::string::npos) TROUPE_SKIP("this build's RUNPATH is not " + runpath);
  bytes.replace(at, runpath.size(), std::string("$ORIGIN") + std::string(runpath.size() - 7, '\0'));
  const fs::path origin = fs::path(dir.path) / "$ORIGIN";
  fs::create_directories(origin);
  write((origin / "program").string(), bytes);
  REQUIRE(::mkfifo((origin / "libtroupe_control.so.0.1").c_str(), 0600) == 0);
  CHECK(holds_within(
      [&] {   // the program itself, then libraries found elsewhere (the FIFO is passed over)
        const auto got = prefetch_program((origin / "program").string());
        if (got.files.empty() || got.files.front() != canonical((origin / "program").string())) return false;
        return std::none_of(got.files.begin() + 1, got.files.end(),
                            [](const std::string& f) { return f.find("$ORIGIN") != std::string::npos; });
      },
      std::chrono::seconds(20)));
}
