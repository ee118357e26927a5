// The head's copy of every job's output (its driver's, and its worker processes' prefixed with
// their actors' names): one file per job under <session>/jobs/, so logs outlive the driver's node.
// Bounded twice: a job's log stops growing at `per_job` bytes (a last line says so), and past
// `total` bytes in all the logs of the oldest ended jobs are removed. Followers (logs -f) wait on
// it for new bytes or the job's end. Thread-safe, with a lock of its own (not the head's).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace troupe::control {

class JobLogs {
 public:
  JobLogs(std::string dir, std::uint64_t per_job, std::uint64_t total);

  void open(std::uint64_t job);                              // a live job: followers wait for it
  void append(std::uint64_t job, std::string_view bytes);
  void close(std::uint64_t job);                             // it ended: followers finish
  void remove(std::uint64_t job);
  // Up to `max` bytes from `offset`; *at_end says whether the job has ended and nothing is left.
  std::string read(std::uint64_t job, std::uint64_t offset, std::size_t max, bool* at_end);
  // Waits until the log has bytes past `offset`, the job ends, stop() or `deadline`.
  void wait(std::uint64_t job, std::uint64_t offset, std::chrono::steady_clock::time_point deadline);
  void stop();
  std::string path(std::uint64_t job) const;

 private:
  struct Log {
    std::uint64_t size = 0;
    bool live = false;
    bool capped = false;
  };
  void trim_total();   // mu_ held
  Log& log(std::uint64_t job);   // mu_ held; an existing file's size is read once

  std::string dir_;
  std::uint64_t per_job_, total_cap_;
  std::uint64_t total_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::uint64_t, Log> logs_;
};

}  // namespace troupe::control
