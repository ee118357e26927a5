// Reading a small file of /proc without exceptions. std::ifstream is not safe for this: when the
// process is dying, a read of /proc/<pid>/stat fails with ESRCH, and libstdc++'s filebuf throws
// std::ios_base::failure from underflow whatever the stream's exception mask (seen: the head's
// driver watch terminated with it).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

namespace troupe {

// The file's bytes into `out`; 0, or the errno that stopped it (ENOENT, ESRCH: the process is gone).
inline int read_proc_file(const std::string& path, std::string& out) {
  out.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, std::size_t(n));
      continue;
    }
    const int err = n < 0 ? errno : 0;
    if (err == EINTR) continue;
    ::close(fd);
    return err;
  }
}

// The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses):
// [0] is field 3 (state), [1] field 4 (ppid), ..., [19] field 22 (starttime). Empty when the
// process is gone (or going) or the file does not parse.
inline std::vector<std::string> proc_stat_fields(long pid) {
  std::string text;
  if (read_proc_file("/proc/" + std::to_string(pid) + "/stat", text) != 0) return {};
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return {};
  std::vector<std::string> out;
  for (std::size_t at = close + 2; at < text.size();) {
    const auto end = text.find_first_of(" \n", at);
    out.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

}  // namespace troupe
