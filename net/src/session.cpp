#include "troupe/net/session.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace troupe::net {
namespace fs = std::filesystem;

std::string make_session_dir(const std::string& root, bool make_latest) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &tm);
  fs::path dir = fs::path(root) / ("session_" + std::string(stamp) + "_" + std::to_string(::getpid()));
  std::error_code ec;
  fs::create_directories(dir / "logs", ec);
  if (ec) throw std::runtime_error("cannot create session directory " + dir.string() + ": " + ec.message());
  if (!make_latest) return dir.string();
  fs::path latest = fs::path(root) / "session_latest";
  fs::path tmp = fs::path(root) / ("session_latest." + std::to_string(::getpid()));
  fs::remove(tmp, ec);
  fs::create_directory_symlink(dir.filename(), tmp, ec);
  if (!ec) fs::rename(tmp, latest, ec);   // atomic repoint
  return dir.string();
}

void write_private_file(const std::string& path, const std::string& content) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write " + path);
  ::fchmod(fd, 0600);
  std::size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n <= 0) { ::close(fd); throw std::runtime_error("cannot write " + path); }
    done += std::size_t(n);
  }
  ::close(fd);
}

std::vector<std::string> session_dirs(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("session_", 0) != 0 || name == "session_latest" || e.is_symlink(ec) || !e.is_directory(ec)) continue;
    if (fs::exists(e.path() / "head_address", ec) && fs::exists(e.path() / "token", ec)) out.push_back(e.path().string());
  }
  std::sort(out.rbegin(), out.rend());   // session_<time>_<pid>: newest first
  return out;
}

std::string latest_session_token(const std::string& root) {
  std::ifstream in(fs::path(root) / "session_latest" / "token");
  std::string token;
  if (in) std::getline(in, token);
  return token;
}

}  // namespace troupe::net
