#include "job_logs.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

namespace troupe::control {
namespace fs = std::filesystem;

JobLogs::JobLogs(std::string dir, std::uint64_t per_job, std::uint64_t total)
    : dir_(std::move(dir)), per_job_(per_job), total_cap_(total) {
  fs::create_directories(dir_);
}

std::string JobLogs::path(std::uint64_t job) const { return (fs::path(dir_) / (std::to_string(job) + ".log")).string(); }

JobLogs::Log& JobLogs::log(std::uint64_t job) {
  auto [it, fresh] = logs_.try_emplace(job);
  if (fresh) {
    std::error_code ec;
    const auto size = fs::file_size(path(job), ec);
    it->second.size = ec ? 0 : size;
    it->second.capped = it->second.size >= per_job_;
    total_ += it->second.size;
  }
  return it->second;
}

void JobLogs::open(std::uint64_t job) {
  std::lock_guard lk(mu_);
  log(job).live = true;
}

void JobLogs::append(std::uint64_t job, std::string_view bytes) {
  std::lock_guard lk(mu_);
  Log& l = log(job);
  if (l.capped || bytes.empty()) return;
  std::string_view keep = bytes.substr(0, std::size_t(std::min<std::uint64_t>(bytes.size(), per_job_ - l.size)));
  std::string out(keep);
  if (keep.size() < bytes.size()) {
    l.capped = true;
    out += "\n[troupe: this job's log reached " + std::to_string(per_job_) + " bytes; later output is dropped]\n";
  }
  std::ofstream f(path(job), std::ios::binary | std::ios::app);
  f.write(out.data(), std::streamsize(out.size()));
  if (!f) {
    spdlog::error("head: cannot write job {}'s log", job);
    return;
  }
  l.size += out.size();
  total_ += out.size();
  trim_total();
  cv_.notify_all();
}

void JobLogs::close(std::uint64_t job) {
  std::lock_guard lk(mu_);
  log(job).live = false;
  cv_.notify_all();
}

void JobLogs::remove(std::uint64_t job) {
  std::lock_guard lk(mu_);
  if (auto it = logs_.find(job); it != logs_.end()) {
    total_ -= it->second.size;
    logs_.erase(it);
  }
  std::error_code ec;
  fs::remove(path(job), ec);
  cv_.notify_all();
}

std::string JobLogs::read(std::uint64_t job, std::uint64_t offset, std::size_t max, bool* at_end) {
  std::uint64_t size = 0;
  bool live = false;
  {
    std::lock_guard lk(mu_);
    const Log& l = log(job);
    size = l.size;
    live = l.live && !stopping_;
  }
  std::string out;
  if (offset < size) {
    std::ifstream f(path(job), std::ios::binary);
    f.seekg(std::streamoff(offset));
    out.resize(std::size_t(std::min<std::uint64_t>(max, size - offset)));
    f.read(out.data(), std::streamsize(out.size()));
    out.resize(std::size_t(f.gcount()));
  }
  if (at_end != nullptr) *at_end = !live && offset + out.size() >= size;
  return out;
}

void JobLogs::wait(std::uint64_t job, std::uint64_t offset, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lk(mu_);
  cv_.wait_until(lk, deadline, [&] {
    const Log& l = log(job);
    return stopping_ || !l.live || l.size > offset;
  });
}

void JobLogs::stop() {
  std::lock_guard lk(mu_);
  stopping_ = true;
  cv_.notify_all();
}

void JobLogs::trim_total() {
  for (auto it = logs_.begin(); total_ > total_cap_ && it != logs_.end();) {
    if (it->second.live) {
      ++it;
      continue;
    }
    spdlog::info("head: the jobs' logs passed {} bytes; removing job {}'s", total_cap_, it->first);
    total_ -= it->second.size;
    std::error_code ec;
    fs::remove(path(it->first), ec);
    it->second.size = 0;
    it->second.capped = true;   // an ended job gets no more output anyway
    ++it;
  }
}

}  // namespace troupe::control
