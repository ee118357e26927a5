// Reading a small file of /proc without exceptions. std::ifstream is not safe for this: when the
// process is dying, a read of /proc/<pid>/stat fails with ESRCH, and libstdc++'s filebuf throws
// std::ios_base::failure from underflow whatever the stream's exception mask (seen: the head's
// driver watch terminated with it).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

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

}  // namespace troupe
