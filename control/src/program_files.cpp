// prefetch_program (process.hpp): a program's binary and the shared libraries it needs, read into
// the page cache whole before it starts. The dependencies are read from the ELF files themselves
// (each file is read ahead first, so that parsing it costs no further disk reads); every offset
// and size in them is checked against the file: a job's binary is the user's bytes.
#include "troupe/control/process.hpp"

#include <elf.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

namespace troupe::control {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxFiles = 1024;
constexpr std::uint16_t kMaxHeaders = 512;          // program headers of one file
constexpr std::uint64_t kMaxDynamic = 64u << 10;    // bytes of its dynamic section
constexpr std::uint64_t kMaxStrings = 4u << 20;     // bytes of its dynamic string table

// A file's descriptor, closed on scope exit.
struct Fd {
  int fd;
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

bool read_at(int fd, void* out, std::uint64_t size, std::uint64_t offset, std::uint64_t file_size) {
  if (offset > file_size || size > file_size - offset) return false;
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, off_t(offset));
    if (n <= 0) return false;
    p += n;
    size -= std::uint64_t(n);
    offset += std::uint64_t(n);
  }
  return true;
}

// What the loader reads of one object: the libraries it names, where it says to look for them,
// and its interpreter (an executable's).
struct Dynamic {
  std::vector<std::string> needed, rpath, runpath;
  std::string interpreter;
};

// "a:b:c" -> {"a", "b", "c"}, $ORIGIN (and ${ORIGIN}) replaced by `origin`; entries naming other
// loader variables ($LIB, $PLATFORM) are left out.
std::vector<std::string> search_list(const std::string& value, const std::string& origin) {
  std::vector<std::string> out;
  std::stringstream in(value);
  for (std::string dir; std::getline(in, dir, ':');) {
    for (const char* var : {"${ORIGIN}", "$ORIGIN"}) {
      for (auto at = dir.find(var); at != std::string::npos; at = dir.find(var)) dir.replace(at, std::strlen(var), origin);
    }
    if (!dir.empty() && dir.find('$') == std::string::npos) out.push_back(dir);
  }
  return out;
}

// The object's dynamic section, if `fd` is a 64-bit little-endian ELF file of `size` bytes.
std::optional<Dynamic> read_dynamic(int fd, std::uint64_t size, const std::string& origin) {
  Elf64_Ehdr eh{};
  if (!read_at(fd, &eh, sizeof eh, 0, size)) return std::nullopt;
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > kMaxHeaders) {
    return std::nullopt;
  }
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  if (!read_at(fd, ph.data(), ph.size() * sizeof(Elf64_Phdr), eh.e_phoff, size)) return std::nullopt;
  Dynamic d;
  const Elf64_Phdr* dyn = nullptr;
  for (const auto& h : ph) {
    if (h.p_type == PT_DYNAMIC) dyn = &h;
    if (h.p_type == PT_INTERP && h.p_filesz > 1 && h.p_filesz < 4096) {
      std::string interp(h.p_filesz, '\0');
      if (read_at(fd, interp.data(), interp.size(), h.p_offset, size)) d.interpreter = interp.c_str();
    }
  }
  if (dyn == nullptr) return d;   // static: nothing more to load
  const std::uint64_t dyn_bytes = std::min<std::uint64_t>(dyn->p_filesz, kMaxDynamic);
  std::vector<Elf64_Dyn> entries(dyn_bytes / sizeof(Elf64_Dyn));
  if (!read_at(fd, entries.data(), entries.size() * sizeof(Elf64_Dyn), dyn->p_offset, size)) return std::nullopt;
  std::uint64_t strtab = 0, strsz = 0;
  std::vector<std::uint64_t> needed, rpath, runpath;   // offsets into the string table
  for (const auto& e : entries) {
    if (e.d_tag == DT_NULL) break;
    switch (e.d_tag) {
      case DT_STRTAB: strtab = e.d_un.d_ptr; break;
      case DT_STRSZ: strsz = e.d_un.d_val; break;
      case DT_NEEDED: needed.push_back(e.d_un.d_val); break;
      case DT_RPATH: rpath.push_back(e.d_un.d_val); break;
      case DT_RUNPATH: runpath.push_back(e.d_un.d_val); break;
      default: break;
    }
  }
  if (strsz == 0 || strsz > kMaxStrings) return d;
  // The string table's address, as a file offset: the loadable segment that holds it.
  std::optional<std::uint64_t> at;
  for (const auto& h : ph) {
    if (h.p_type == PT_LOAD && strtab >= h.p_vaddr && strtab - h.p_vaddr < h.p_filesz) {
      at = strtab - h.p_vaddr + h.p_offset;
      break;
    }
  }
  std::string strings(strsz, '\0');
  if (!at || !read_at(fd, strings.data(), strsz, *at, size)) return d;
  auto text = [&](std::uint64_t off) { return off < strsz ? std::string(strings.c_str() + off) : std::string(); };
  for (auto off : needed) {
    if (auto name = text(off); !name.empty()) d.needed.push_back(std::move(name));
  }
  for (auto off : rpath) {
    for (auto& dir : search_list(text(off), origin)) d.rpath.push_back(std::move(dir));
  }
  for (auto off : runpath) {
    for (auto& dir : search_list(text(off), origin)) d.runpath.push_back(std::move(dir));
  }
  return d;
}

// The directories /etc/ld.so.conf names (its includes followed), then the loader's defaults.
std::vector<std::string> system_dirs() {
  std::vector<std::string> dirs;
  std::set<std::string> seen_files;
  std::deque<std::string> files{"/etc/ld.so.conf"};
  while (!files.empty() && seen_files.size() < 256) {
    const std::string file = files.front();
    files.pop_front();
    if (!seen_files.insert(file).second) continue;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
      line = line.substr(0, line.find('#'));
      std::stringstream words(line);
      std::string first;
      if (!(words >> first)) continue;
      if (first == "include") {
        for (std::string pattern; words >> pattern;) {
          glob_t g{};
          if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
            for (std::size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
          }
          ::globfree(&g);
        }
      } else if (first.front() == '/') {
        dirs.push_back(first);
      }
    }
  }
  for (const char* d : {"/lib64", "/usr/lib64", "/lib", "/usr/lib"}) dirs.emplace_back(d);
  return dirs;
}

// The first 64-bit ELF file named `name` in `dirs`.
std::optional<std::string> find_in(const std::string& name, const std::vector<std::string>& dirs) {
  for (const auto& dir : dirs) {
    const std::string candidate = dir + "/" + name;
    Fd f(candidate);
    if (f.fd < 0) continue;
    struct stat st{};
    Elf64_Ehdr eh{};
    if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode) || !read_at(f.fd, &eh, sizeof eh, 0, std::uint64_t(st.st_size))) continue;
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64) return candidate;
  }
  return std::nullopt;
}

// `binary` as execvp finds it: itself when it names a path, else the first executable in `path`.
std::optional<std::string> locate(const std::string& binary, const std::string& path) {
  if (binary.find('/') != std::string::npos) return binary;
  for (const auto& dir : search_list(path, "")) {
    const std::string candidate = dir + "/" + binary;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

}  // namespace

Prefetched prefetch_program(const std::string& binary, const std::string& ld_library_path, const std::string& path) {
  Prefetched out;
  try {
    const auto exe = locate(binary, path);
    if (!exe) return out;
    const auto library_path = search_list(ld_library_path, "");
    std::optional<std::vector<std::string>> system;   // read once, when a library needs it
    std::set<std::string> seen;
    std::deque<std::string> queue{*exe};
    while (!queue.empty() && out.files.size() < kMaxFiles) {
      std::error_code ec;
      const std::string file = fs::weakly_canonical(queue.front(), ec).string();
      queue.pop_front();
      if (ec || !seen.insert(file).second) continue;
      Fd f(file);
      struct stat st{};
      if (f.fd < 0 || ::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;
      const auto size = std::uint64_t(st.st_size);
      ::readahead(f.fd, 0, size);   // whole, in order: what follows reads from the cache
      out.files.push_back(file);
      out.bytes += size;
      const auto dynamic = read_dynamic(f.fd, size, fs::path(file).parent_path().string());
      if (!dynamic) continue;
      if (!dynamic->interpreter.empty()) queue.push_back(dynamic->interpreter);
      for (const auto& name : dynamic->needed) {
        if (name.find('/') != std::string::npos) {
          queue.push_back(name);
          continue;
        }
        // The loader's order: DT_RPATH (when there is no DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH,
        // then the system's directories (ld.so.cache holds what ld.so.conf's directories hold).
        std::vector<std::string> dirs;
        if (dynamic->runpath.empty()) dirs = dynamic->rpath;
        dirs.insert(dirs.end(), library_path.begin(), library_path.end());
        dirs.insert(dirs.end(), dynamic->runpath.begin(), dynamic->runpath.end());
        auto found = find_in(name, dirs);
        if (!found) {
          if (!system) system = system_dirs();
          found = find_in(name, *system);
        }
        if (found) queue.push_back(*found);
      }
    }
  } catch (const std::exception&) {   // best effort: what was read ahead stays read
  }
  return out;
}

}  // namespace troupe::control
