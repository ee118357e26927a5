// prefetch_program (process.hpp): a program's binary and the shared libraries it needs, read into
// the page cache whole before it starts. The dependencies are read from the ELF files themselves
// with libelf (each file is read ahead first, so that parsing it costs no further disk reads);
// every offset and size in them is checked against the file: a job's binary is the user's bytes.
#include "troupe/control/process.hpp"

#include <fcntl.h>
#include <gelf.h>
#include <glob.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

namespace troupe::control {
namespace {

namespace fs = std::filesystem;

// Bounds on what one program's files can make the walk do: a job's files are the user's bytes.
constexpr std::size_t kMaxFiles = 1024;
constexpr std::uint16_t kMaxHeaders = 512;          // program headers of one file
constexpr std::uint16_t kMaxSections = 4096;        // section headers of one file (libelf allocates for each)
constexpr std::uint64_t kMaxDynamic = 64u << 10;    // bytes of its dynamic section
constexpr std::size_t kMaxNeeded = 256;             // libraries one object names
constexpr std::size_t kMaxDirs = 64;                // directories one object's search looks in
constexpr std::size_t kMaxPathEntries = 8;          // DT_RPATH or DT_RUNPATH entries of one object
constexpr std::size_t kMaxName = 4096;              // bytes of one name or directory
constexpr std::uint64_t kMaxBytes = 8ull << 30;     // read ahead in all
constexpr auto kMaxTime = std::chrono::seconds(10);  // then the program starts as it would have

// A regular file's descriptor (-1 for anything else: a FIFO would block the open, a device's open
// may do something), closed on scope exit; `size` its size.
struct Fd {
  int fd = -1;
  std::uint64_t size = 0;
  explicit Fd(const std::string& path) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {   // replaced since the stat
      ::close(fd);
      fd = -1;
    }
    size = std::uint64_t(st.st_size);
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// What the loader reads of one object: the libraries it names, where it says to look for them,
// and its interpreter (an executable's).
struct Dynamic {
  std::vector<std::string> needed, rpath, runpath;
  std::string interpreter;
};

// "a:b:c" -> {"a", "b", "c"}, $ORIGIN (and ${ORIGIN}) replaced by `origin`; entries naming other
// loader variables ($LIB, $PLATFORM) are left out. At most kMaxDirs, each under kMaxName bytes.
std::vector<std::string> search_list(const std::string& value, const std::string& origin) {
  std::vector<std::string> out;
  std::stringstream in(value);
  for (std::string entry; out.size() < kMaxDirs && std::getline(in, entry, ':');) {
    std::string dir;   // one pass: an origin that itself holds "$ORIGIN" is not expanded again
    for (std::size_t i = 0; i < entry.size() && dir.size() < kMaxName;) {
      if (entry.compare(i, 9, "${ORIGIN}") == 0) {
        dir += origin;
        i += 9;
      } else if (entry.compare(i, 7, "$ORIGIN") == 0) {
        dir += origin;
        i += 7;
      } else {
        dir += entry[i++];
      }
    }
    if (!dir.empty() && dir.size() < kMaxName && dir.find('$') == std::string::npos) out.push_back(std::move(dir));
  }
  return out;
}

// Whether `f` starts with the header of a 64-bit little-endian ELF file whose section count
// libelf can be given. elf_begin allocates for every section (~200 bytes each) before anything else
// is read, so a header claiming 65,535 sections, or millions with extended numbering, would cost
// the node's daemon that much for a user's file; the loader reads no sections, and real objects
// have tens of them.
bool is_elf64(const Fd& f) {
  Elf64_Ehdr eh{};
  if (f.fd < 0 || f.size < sizeof eh || ::pread(f.fd, &eh, sizeof eh, 0) != ssize_t(sizeof eh)) return false;
  return std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64 &&
         eh.e_ident[EI_DATA] == ELFDATA2LSB && (eh.e_phnum == 0 || eh.e_phentsize == sizeof(Elf64_Phdr)) &&
         eh.e_shnum <= kMaxSections && (eh.e_shnum != 0 || eh.e_shoff == 0);
}

// A libelf descriptor of an open file (one is_elf64 accepted), ended on scope exit. ELF_C_READ maps
// nothing: libelf reads what is asked for with pread, and refuses a range outside the file (a file
// cut short under it gives an error, not SIGBUS).
class ElfFile {
 public:
  explicit ElfFile(int fd) {
    static const bool ready = ::elf_version(EV_CURRENT) != EV_NONE;
    if (ready && fd >= 0) elf_ = ::elf_begin(fd, ELF_C_READ, nullptr);
  }
  ~ElfFile() { ::elf_end(elf_); }   // null: nothing
  ElfFile(const ElfFile&) = delete;
  ElfFile& operator=(const ElfFile&) = delete;

  Elf* get() const { return elf_; }
  // `size` bytes at `offset` of the file, or null when they are not all in it.
  Elf_Data* bytes(std::uint64_t offset, std::uint64_t size, Elf_Type type = ELF_T_BYTE) const {
    if (offset > std::uint64_t(std::numeric_limits<std::int64_t>::max())) return nullptr;
    return ::elf_getdata_rawchunk(elf_, std::int64_t(offset), std::size_t(size), type);
  }

 private:
  Elf* elf_ = nullptr;
};

// The object's dynamic section (`file`, of `size` bytes, is one is_elf64 accepted).
std::optional<Dynamic> read_dynamic(const ElfFile& file, std::uint64_t size, const std::string& origin) {
  std::size_t headers = 0;
  if (file.get() == nullptr || ::elf_getphdrnum(file.get(), &headers) != 0 || headers > kMaxHeaders) return std::nullopt;
  std::vector<GElf_Phdr> ph(headers);
  for (std::size_t i = 0; i < headers; ++i) {
    if (::gelf_getphdr(file.get(), int(i), &ph[i]) == nullptr) return std::nullopt;
  }
  Dynamic d;
  const GElf_Phdr* dyn = nullptr;
  for (const auto& h : ph) {
    if (h.p_type == PT_DYNAMIC) dyn = &h;
    // The first PT_INTERP, as the kernel takes it.
    if (h.p_type == PT_INTERP && d.interpreter.empty() && h.p_filesz > 1 && h.p_filesz < 4096) {
      if (const Elf_Data* s = file.bytes(h.p_offset, h.p_filesz)) {
        d.interpreter.assign(static_cast<const char*>(s->d_buf), ::strnlen(static_cast<const char*>(s->d_buf), s->d_size));
      }
    }
  }
  if (dyn == nullptr) return d;   // static: nothing more to load
  const std::uint64_t dyn_bytes = std::min<std::uint64_t>(dyn->p_filesz, kMaxDynamic) / sizeof(Elf64_Dyn) * sizeof(Elf64_Dyn);
  if (dyn_bytes == 0) return d;
  Elf_Data* entries = file.bytes(dyn->p_offset, dyn_bytes, ELF_T_DYN);
  if (entries == nullptr) return std::nullopt;
  std::uint64_t strtab = 0, strsz = 0;
  std::vector<std::uint64_t> needed, rpath, runpath;   // offsets into the string table
  GElf_Dyn e{};
  for (int i = 0; ::gelf_getdyn(entries, i, &e) != nullptr && e.d_tag != DT_NULL; ++i) {
    switch (e.d_tag) {
      case DT_STRTAB: strtab = e.d_un.d_ptr; break;
      case DT_STRSZ: strsz = e.d_un.d_val; break;
      case DT_NEEDED:
        if (needed.size() < kMaxNeeded) needed.push_back(e.d_un.d_val);
        break;
      case DT_RPATH:
        if (rpath.size() < kMaxPathEntries) rpath.push_back(e.d_un.d_val);
        break;
      case DT_RUNPATH:
        if (runpath.size() < kMaxPathEntries) runpath.push_back(e.d_un.d_val);
        break;
      default: break;
    }
  }
  if (strsz == 0) return d;
  // The string table's address, as a file offset: the loadable segment that holds it.
  std::optional<std::uint64_t> at;
  for (const auto& h : ph) {
    if (h.p_type == PT_LOAD && strtab >= h.p_vaddr && strtab - h.p_vaddr < h.p_filesz) {
      at = strtab - h.p_vaddr + h.p_offset;
      break;
    }
  }
  if (!at || *at >= size) return d;
  // One string of the table (a C++ library's runs to megabytes: only the names are read): "" for
  // an offset outside it, or a name of kMaxName bytes or more.
  auto text = [&](std::uint64_t off) {
    if (off >= strsz || off >= size - *at) return std::string();
    const Elf_Data* s = file.bytes(*at + off, std::min<std::uint64_t>({kMaxName, strsz - off, size - *at - off}));
    if (s == nullptr) return std::string();
    const auto* p = static_cast<const char*>(s->d_buf);
    const std::size_t len = ::strnlen(p, s->d_size);
    return len < s->d_size ? std::string(p, len) : std::string();
  };
  for (auto off : needed) {
    if (auto name = text(off); !name.empty()) d.needed.push_back(std::move(name));
  }
  for (auto off : rpath) {
    for (auto& dir : search_list(text(off), origin)) {
      if (d.rpath.size() < kMaxDirs) d.rpath.push_back(std::move(dir));
    }
  }
  for (auto off : runpath) {
    for (auto& dir : search_list(text(off), origin)) {
      if (d.runpath.size() < kMaxDirs) d.runpath.push_back(std::move(dir));
    }
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
    std::string candidate = dir + "/" + name;
    if (is_elf64(Fd(candidate))) return candidate;
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
    const auto deadline = std::chrono::steady_clock::now() + kMaxTime;
    const auto library_path = search_list(ld_library_path, "");
    std::optional<std::vector<std::string>> system;   // read once, when a library needs it
    struct Item {
      std::string path;
      std::vector<std::string> loader_rpath;   // DT_RPATH of the objects that led here, nearest first
    };
    std::set<std::string> seen;        // canonical paths read
    std::set<std::string> named;       // names already looked up: ld.so loads a name once
    std::deque<Item> queue{{*exe, {}}};
    for (bool first = true; !queue.empty() && out.files.size() < kMaxFiles && out.bytes < kMaxBytes &&
                            std::chrono::steady_clock::now() < deadline;
         first = false) {
      Item item = std::move(queue.front());
      queue.pop_front();
      std::error_code ec;
      const std::string file = fs::weakly_canonical(item.path, ec).string();
      if (ec || !seen.insert(file).second) continue;
      Fd f(file);
      if (f.fd < 0) continue;
      const bool elf64 = is_elf64(f);
      if (!first && !elf64) continue;   // the program itself may be a script
      ::readahead(f.fd, 0, f.size);   // whole, in order: what follows reads from the cache
      out.files.push_back(file);
      out.bytes += f.size;
      if (!elf64) continue;
      const auto dynamic = read_dynamic(ElfFile(f.fd), f.size, fs::path(file).parent_path().string());
      if (!dynamic) continue;
      if (first && !dynamic->interpreter.empty() && dynamic->interpreter.front() == '/') {
        queue.push_back({dynamic->interpreter, {}});
      }
      // The loader's order: without DT_RUNPATH, the DT_RPATH of this object and of those that
      // loaded it, up to the program; LD_LIBRARY_PATH; DT_RUNPATH; the system's directories
      // (ld.so.cache holds what ld.so.conf's directories hold).
      std::vector<std::string> rpath = dynamic->rpath;
      for (const auto& d : item.loader_rpath) {
        if (rpath.size() < kMaxDirs) rpath.push_back(d);
      }
      std::vector<std::string> dirs;
      if (dynamic->runpath.empty()) dirs = rpath;
      dirs.insert(dirs.end(), library_path.begin(), library_path.end());
      dirs.insert(dirs.end(), dynamic->runpath.begin(), dynamic->runpath.end());
      for (const auto& name : dynamic->needed) {
        if (queue.size() >= 4 * kMaxFiles) break;
        if (name.find('/') != std::string::npos) {
          if (name.front() == '/') queue.push_back({name, rpath});
          continue;
        }
        if (!named.insert(name).second) continue;
        auto found = find_in(name, dirs);
        if (!found) {
          if (!system) system = system_dirs();
          found = find_in(name, *system);
        }
        if (found) queue.push_back({*found, rpath});
      }
    }
  } catch (const std::exception&) {   // best effort: what was read ahead stays read
  }
  return out;
}

}  // namespace troupe::control
