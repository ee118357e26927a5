// Job packages: a working directory as one tar archive (libarchive), named by the SHA-256 of its
// bytes. The CLI packs, the head checks what it is sent, each node's daemon keeps the archives it
// fetched in a bounded cache and unpacks them into a job's directory. An archive is untrusted
// input everywhere: an entry with an absolute path, a ".." component, a link leading out of the
// directory or a kind other than file, directory or symlink refuses the whole archive, and
// nothing is written outside the destination.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "troupe/error.hpp"

namespace troupe::control {

// Packs `dir` (regular files, directories and symlinks, recursively; symlinks are kept as links
// and must stay inside `dir`) into an uncompressed tar archive at `out`. Throws std::runtime_error
// naming what could not be read or written.
void pack_directory(const std::string& dir, const std::string& out);

// The node daemon's record of the package a job's directory holds: no package may have an entry
// of that name (a symlink there would have the daemon write through it).
inline constexpr const char* kUnpackedMarker = ".troupe-package";
// Entries an archive may hold at most (a small archive of empty headers would loop for hours).
inline constexpr std::uint64_t kMaxPackageEntries = 200000;

// Checks every entry of the archive at `path` (see above), that it has at most kMaxPackageEntries
// and that its unpacked size stays under `max_unpacked` bytes; an archive is plain tar or gzip'd.
// ControlCode::BadRequest naming the entry and what is wrong with it.
Status check_package(const std::string& path, std::uint64_t max_unpacked);

// check_package, then unpacks into `dest` (created if missing). On an error `dest` may hold part
// of the archive, never anything outside it.
Status unpack_package(const std::string& path, const std::string& dest, std::uint64_t max_unpacked);

// Archives by digest, <root>/<sha256>.tar, least recently used first out once their total passes
// `cap_bytes`: a node's fetched packages, and the head's uploaded ones (which keeps those its live
// jobs name). Not thread-safe: its owner serializes use.
class PackageCache {
 public:
  PackageCache(std::string root, std::uint64_t cap_bytes);
  const std::string& root() const { return root_; }
  std::string path(const std::string& digest) const;
  // True when the archive is here; marks it used now.
  bool has(const std::string& digest);
  // Moves a checked download at `file` in as `digest`, then trims the cache to its cap (never
  // removing `digest` itself, nor one `in_use` says is).
  void add(const std::string& digest, const std::string& file,
           const std::function<bool(const std::string&)>& in_use = {});
  void trim(const std::string& keep, const std::function<bool(const std::string&)>& in_use = {});

 private:
  std::string root_;
  std::uint64_t cap_;
};

}  // namespace troupe::control
