// Session directories: everything a cluster started on this machine writes (logs/, store.db, the
// token file, the head's address, logs) lives under <root>/session_<time>_<pid>/;
// <root>/session_latest points at the newest cluster started with `troupe start` (a program's
// embedded cluster has a session of its own and leaves session_latest alone).
#pragma once

#include <string>
#include <vector>

namespace troupe::net {

// Creates <root>/session_<YYYYmmdd_HHMMSS>_<pid>/logs and, when `latest`, repoints
// session_latest. Returns the session directory. Throws std::runtime_error naming the path.
std::string make_session_dir(const std::string& root, bool latest = true);

// The session directories under `root` that hold a head's address and token, newest first.
std::vector<std::string> session_dirs(const std::string& root);

// Writes `content` to `path` readable by the owner only (0600).
void write_private_file(const std::string& path, const std::string& content);

// The first line of <root>/session_latest/token, or "" if there is none.
std::string latest_session_token(const std::string& root);

}  // namespace troupe::net
