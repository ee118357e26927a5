// Session directories: everything a cluster started on this machine writes (logs/, store.db, the
// token file, pid files) lives under <root>/session_<time>_<pid>/; <root>/session_latest points
// at the newest.
#pragma once

#include <string>

namespace troupe::net {

// Creates <root>/session_<YYYYmmdd_HHMMSS>_<pid>/logs and repoints session_latest. Returns the
// session directory. Throws std::runtime_error naming the path on failure.
std::string make_session_dir(const std::string& root);

// Writes `content` to `path` readable by the owner only (0600).
void write_private_file(const std::string& path, const std::string& content);

// The first line of <root>/session_latest/token, or "" if there is none.
std::string latest_session_token(const std::string& root);

}  // namespace troupe::net
