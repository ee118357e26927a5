// build/bench/program_start: what a node's read-ahead (control::prefetch_program) costs and saves
// when it starts a program, here build/bin/grpo (or the program given as the first argument) run
// with --help: loaded, initialised, exits. "Cold" means its files were dropped from the page cache
// first (posix_fadvise DONTNEED; pages other processes map stay, so libc and friends stay warm).
// One JSON object on its last line:
//   files, mib                      what prefetch_program reads for the program
//   prefetch_warm_ms                prefetch_program with every file cached, median of 5
//   cold_start_s                    the start with its files dropped, median of 3
//   cold_start_major_faults         its major page faults (the disk reads it waited for)
//   prefetch_cold_s                 prefetch_program with its files dropped, median of 3
//   start_after_prefetch_s          the start right after it, median of 3
//   start_after_prefetch_major_faults
// How much the read-ahead saves depends on the disk: on this VM, while its disk was busy, a cold
// start took 28 s against 4.4 s + 0.5 s; while it was quiet, 1.0-1.4 s against 0.5 s + 0.8 s.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/control/process.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void drop_from_cache(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct Start {
  double seconds = 0;
  long major_faults = 0;
};

// `program --help`, its output dropped: wall time and major faults.
Start start(const std::string& program) {
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(null_fd, STDERR_FILENO);
    ::execl(program.c_str(), program.c_str(), "--help", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  rusage ru{};
  ::wait4(pid, &status, 0, &ru);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::cerr << program << " --help did not exit with 0\n";
    std::exit(1);
  }
  return Start{seconds_since(t0), ru.ru_majflt};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program = argc > 1 ? argv[1] : TROUPE_PROGRAM;
  const auto files = troupe::control::prefetch_program(program);
  if (files.files.empty()) {
    std::cerr << "cannot read " << program << "\n";
    return 1;
  }
  std::vector<double> warm;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    troupe::control::prefetch_program(program);
    warm.push_back(seconds_since(t0) * 1e3);
  }
  std::vector<double> cold, cold_faults, prefetch, after, after_faults;
  for (int i = 0; i < 3; ++i) {   // alternated, so that both see the disk in the same state
    drop_from_cache(files.files);
    const auto c = start(program);
    cold.push_back(c.seconds);
    cold_faults.push_back(double(c.major_faults));
    drop_from_cache(files.files);
    const auto t0 = Clock::now();
    troupe::control::prefetch_program(program);
    prefetch.push_back(seconds_since(t0));
    const auto a = start(program);
    after.push_back(a.seconds);
    after_faults.push_back(double(a.major_faults));
  }
  nlohmann::json out{{"program", program},
                     {"files", files.files.size()},
                     {"mib", files.bytes >> 20},
                     {"prefetch_warm_ms", median(warm)},
                     {"cold_start_s", median(cold)},
                     {"cold_start_major_faults", median(cold_faults)},
                     {"prefetch_cold_s", median(prefetch)},
                     {"start_after_prefetch_s", median(after)},
                     {"start_after_prefetch_major_faults", median(after_faults)}};
  std::cout << out.dump() << std::endl;
  return 0;
}
