#include "troupe/control/package.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

namespace troupe::control {
namespace fs = std::filesystem;
namespace {

struct ReadCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};
struct WriteCloser {
  void operator()(archive* a) const { archive_write_free(a); }
};
using ReadArchive = std::unique_ptr<archive, ReadCloser>;
using WriteArchive = std::unique_ptr<archive, WriteCloser>;

Error bad_package(const std::string& what) { return Error{ControlCode::BadRequest, "bad package: " + what}; }

// A relative path that stays inside its root when read from `base` (a directory inside the
// root, "" for the root itself): no absolute path, and ".." never climbs above the root.
bool stays_inside(const std::string& base, const std::string& path) {
  if (path.empty() || path.front() == '/') return false;
  int depth = 0;
  auto walk = [&depth](const std::string& p) {
    for (const auto& part : fs::path(p)) {
      const std::string s = part.string();
      if (s.empty() || s == ".") continue;
      if (s == "..") {
        if (--depth < 0) return false;
      } else {
        ++depth;
      }
    }
    return true;
  };
  return walk(base) && walk(path);
}

bool has_dotdot(const std::string& path) {
  for (const auto& part : fs::path(path)) {
    if (part == "..") return true;
  }
  return false;
}

// Every entry's check, in one place for check_package and unpack_package.
Status check_entry(archive_entry* e, std::uint64_t& unpacked, std::uint64_t max_unpacked) {
  const char* raw = archive_entry_pathname(e);
  const std::string name = raw != nullptr ? raw : "";
  if (name.empty()) return bad_package("an entry without a name");
  if (name.front() == '/') return bad_package("entry '" + name + "' has an absolute path");
  if (*fs::path(name).lexically_normal().begin() == kUnpackedMarker) return bad_package("entry '" + name + "' is a name the node daemon keeps for itself");
  if (has_dotdot(name)) return bad_package("entry '" + name + "' has a '..' component");
  const auto type = archive_entry_filetype(e);
  if (const char* hard = archive_entry_hardlink(e)) {
    if (!stays_inside("", hard)) return bad_package("entry '" + name + "' is a hard link out of the package");
    return {};
  }
  if (type == AE_IFLNK) {
    const char* target = archive_entry_symlink(e);
    const std::string dir = fs::path(name).parent_path().string();
    if (target == nullptr || !stays_inside(dir, target)) {
      return bad_package("entry '" + name + "' is a symlink leading out of the package (" + (target ? target : "") + ")");
    }
    return {};
  }
  if (type != AE_IFREG && type != AE_IFDIR) return bad_package("entry '" + name + "' is not a file, directory or symlink");
  if (archive_entry_size_is_set(e)) unpacked += std::uint64_t(std::max<la_int64_t>(0, archive_entry_size(e)));
  if (unpacked > max_unpacked) {
    return bad_package("it unpacks to more than " + std::to_string(max_unpacked) + " bytes");
  }
  return {};
}

ReadArchive open_read(const std::string& path, Error& err) {
  ReadArchive a(archive_read_new());
  archive_read_support_format_tar(a.get());
  archive_read_support_format_gnutar(a.get());
  // Uncompressed (what `troupe job submit` packs) or gzip'd: not every filter libarchive has, some
  // of which run an external program (lrzip, grzip, lzop).
  archive_read_support_filter_none(a.get());
  archive_read_support_filter_gzip(a.get());
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 16) != ARCHIVE_OK) {
    err = bad_package(std::string("not a tar archive: ") + archive_error_string(a.get()));
    return nullptr;
  }
  return a;
}

void write_or_throw(archive* a, int rc, const std::string& what) {
  if (rc < ARCHIVE_WARN) throw std::runtime_error("packing " + what + ": " + archive_error_string(a));
}

}  // namespace

void pack_directory(const std::string& dir, const std::string& out) {
  const fs::path root = fs::path(dir);
  if (!fs::is_directory(root)) throw std::runtime_error(dir + " is not a directory");
  WriteArchive a(archive_write_new());
  archive_write_set_format_pax_restricted(a.get());
  if (archive_write_open_filename(a.get(), out.c_str()) != ARCHIVE_OK) {
    throw std::runtime_error("cannot write " + out + ": " + archive_error_string(a.get()));
  }
  std::vector<fs::path> paths;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    paths.push_back(it->path());
  }
  std::sort(paths.begin(), paths.end());   // the same directory packs to the same bytes (and digest)
  std::vector<char> buf(1 << 16);
  for (const auto& p : paths) {
    const std::string rel = p.lexically_relative(root).generic_string();   // not fs::relative: it follows symlinks
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) throw std::runtime_error("cannot read " + p.string());
    std::unique_ptr<archive_entry, void (*)(archive_entry*)> e(archive_entry_new(), archive_entry_free);
    archive_entry_copy_stat(e.get(), &st);
    archive_entry_set_pathname(e.get(), rel.c_str());
    archive_entry_set_mtime(e.get(), 0, 0);   // reproducible: the digest names the content
    archive_entry_set_uid(e.get(), 0);
    archive_entry_set_gid(e.get(), 0);
    if (S_ISLNK(st.st_mode)) {
      const std::string target = fs::read_symlink(p).string();
      if (!stays_inside(fs::path(rel).parent_path().string(), target)) {
        throw std::runtime_error("symlink " + p.string() + " leads out of " + dir);
      }
      archive_entry_set_symlink(e.get(), target.c_str());
    } else if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
      throw std::runtime_error(p.string() + " is not a file, directory or symlink");
    }
    write_or_throw(a.get(), archive_write_header(a.get(), e.get()), rel);
    if (S_ISREG(st.st_mode)) {
      std::ifstream in(p, std::ios::binary);
      if (!in) throw std::runtime_error("cannot read " + p.string());
      while (in) {
        in.read(buf.data(), std::streamsize(buf.size()));
        if (in.gcount() > 0) {
          if (archive_write_data(a.get(), buf.data(), std::size_t(in.gcount())) < 0) write_or_throw(a.get(), ARCHIVE_FATAL, rel);
        }
      }
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK) throw std::runtime_error("cannot finish " + out + ": " + archive_error_string(a.get()));
}

Status check_package(const std::string& path, std::uint64_t max_unpacked) {
  Error err;
  auto a = open_read(path, err);
  if (!a) return err;
  std::uint64_t unpacked = 0, entries = 0;
  archive_entry* e = nullptr;
  for (;;) {
    const int rc = archive_read_next_header(a.get(), &e);
    if (rc == ARCHIVE_EOF) return {};
    if (rc < ARCHIVE_WARN) return bad_package(std::string("unreadable: ") + archive_error_string(a.get()));
    if (++entries > kMaxPackageEntries) return bad_package("more than " + std::to_string(kMaxPackageEntries) + " entries");
    if (auto st = check_entry(e, unpacked, max_unpacked); !st.ok()) return st;
    archive_read_data_skip(a.get());
  }
}

Status unpack_package(const std::string& path, const std::string& dest, std::uint64_t max_unpacked) {
  if (auto st = check_package(path, max_unpacked); !st.ok()) return st;
  std::error_code ec;
  fs::create_directories(dest, ec);
  if (ec) return Error{ControlCode::Store, "cannot make " + dest + ": " + ec.message()};
  Error err;
  auto in = open_read(path, err);
  if (!in) return err;
  WriteArchive out(archive_write_disk_new());
  // The entries were checked above; libarchive refuses ".." and writing through symlinks again.
  archive_write_disk_set_options(out.get(), ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_SECURE_NODOTDOT |
                                                ARCHIVE_EXTRACT_SECURE_SYMLINKS);
  // Its real path: libarchive refuses to write through a symlink anywhere on the way (a session
  // directory reached through session_latest is one).
  const std::string prefix = fs::canonical(dest, ec).string() + "/";
  if (ec) return Error{ControlCode::Store, "cannot resolve " + dest + ": " + ec.message()};
  std::uint64_t unpacked = 0;
  std::vector<char> buf(1 << 16);
  archive_entry* e = nullptr;
  for (;;) {
    int rc = archive_read_next_header(in.get(), &e);
    if (rc == ARCHIVE_EOF) break;
    if (rc < ARCHIVE_WARN) return bad_package(std::string("unreadable: ") + archive_error_string(in.get()));
    if (auto st = check_entry(e, unpacked, max_unpacked); !st.ok()) return st;
    const std::string name = archive_entry_pathname(e);
    archive_entry_set_pathname(e, (prefix + name).c_str());
    if (const char* hard = archive_entry_hardlink(e)) archive_entry_set_hardlink(e, (prefix + hard).c_str());
    if (archive_write_header(out.get(), e) < ARCHIVE_WARN) {
      return Error{ControlCode::Store, "cannot unpack '" + name + "': " + archive_error_string(out.get())};
    }
    for (;;) {
      const la_ssize_t n = archive_read_data(in.get(), buf.data(), buf.size());
      if (n == 0) break;
      if (n < 0) return bad_package("entry '" + name + "' is unreadable: " + archive_error_string(in.get()));
      if (archive_write_data(out.get(), buf.data(), std::size_t(n)) < 0) {
        return Error{ControlCode::Store, "cannot write '" + name + "': " + archive_error_string(out.get())};
      }
    }
    archive_write_finish_entry(out.get());
  }
  if (archive_write_close(out.get()) != ARCHIVE_OK) {
    return Error{ControlCode::Store, std::string("cannot finish unpacking: ") + archive_error_string(out.get())};
  }
  return {};
}

PackageCache::PackageCache(std::string root, std::uint64_t cap_bytes) : root_(std::move(root)), cap_(cap_bytes) {
  fs::create_directories(root_);
}

std::string PackageCache::path(const std::string& digest) const { return (fs::path(root_) / (digest + ".tar")).string(); }

bool PackageCache::has(const std::string& digest) {
  std::error_code ec;
  if (!fs::is_regular_file(path(digest), ec)) return false;
  fs::last_write_time(path(digest), fs::file_time_type::clock::now(), ec);   // used now
  return true;
}

void PackageCache::add(const std::string& digest, const std::string& file,
                       const std::function<bool(const std::string&)>& in_use) {
  fs::rename(file, path(digest));
  std::error_code ec;
  fs::last_write_time(path(digest), fs::file_time_type::clock::now(), ec);
  trim(digest, in_use);
}

void PackageCache::trim(const std::string& keep, const std::function<bool(const std::string&)>& in_use) {
  struct Entry {
    fs::path path;
    fs::file_time_type used;
    std::uint64_t size;
  };
  std::vector<Entry> entries;
  std::uint64_t total = 0;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(root_, ec)) {
    if (!d.is_regular_file(ec) || d.path().extension() != ".tar") continue;
    Entry e{d.path(), d.last_write_time(ec), std::uint64_t(d.file_size(ec))};
    total += e.size;
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (const auto& e : entries) {
    if (total <= cap_) break;
    if (e.path.stem() == keep || (in_use && in_use(e.path.stem().string()))) continue;
    fs::remove(e.path, ec);
    if (!ec) total -= e.size;
  }
}

}  // namespace troupe::control
