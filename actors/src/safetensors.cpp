#include "troupe/actors/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

namespace troupe::actors {
namespace {

using Json = nlohmann::json;

constexpr std::pair<DType, const char*> kDTypeNames[] = {
    {DType::F32, "F32"}, {DType::F64, "F64"}, {DType::F16, "F16"}, {DType::BF16, "BF16"},
    {DType::I64, "I64"}, {DType::I32, "I32"}, {DType::I16, "I16"}, {DType::I8, "I8"},
    {DType::U8, "U8"},   {DType::Bool, "BOOL"}};

const char* dtype_tag(DType d) {
  for (auto& [k, v] : kDTypeNames) if (k == d) return v;
  throw SafetensorsError("unknown dtype");
}

DType parse_dtype(const std::string& name, const std::string& tag) {
  for (auto& [k, v] : kDTypeNames) if (tag == v) return k;
  throw SafetensorsError("tensor '" + name + "': unsupported dtype '" + tag + "'");
}

// Copies a strided view element by element into `out` (contiguous).
void copy_contiguous(const TensorView& t, char* out) {
  const std::size_t es = dtype_size(t.dtype);
  if (t.is_contiguous()) { std::memcpy(out, t.data, t.nbytes()); return; }
  const std::int64_t n = t.numel(), dims = std::int64_t(t.shape.size());
  std::vector<std::int64_t> idx(dims, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t off = 0;
    for (std::int64_t d = 0; d < dims; ++d) off += idx[d] * t.strides[d];
    std::memcpy(out + i * es, static_cast<const char*>(t.data) + off * es, es);
    for (std::int64_t d = dims - 1; d >= 0 && ++idx[d] == t.shape[d]; --d) idx[d] = 0;
  }
}

std::vector<std::int64_t> parse_shape(const std::string& name, const Json& j) {
  if (!j.is_array()) throw SafetensorsError("tensor '" + name + "': shape is not an array");
  std::vector<std::int64_t> shape;
  std::int64_t numel = 1;
  for (auto& d : j) {
    if (!d.is_number_unsigned()) throw SafetensorsError("tensor '" + name + "': shape has a non-natural dimension");
    auto v = d.get<std::uint64_t>();
    if (v > (1ull << 40) || (v > 0 && numel > (std::int64_t(1) << 40) / std::int64_t(v)))
      throw SafetensorsError("tensor '" + name + "': shape too large");
    shape.push_back(std::int64_t(v));
    numel *= std::int64_t(v);
  }
  return shape;
}

struct Entry {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin, end;
};

Entry parse_entry(const std::string& name, const Json& j, std::uint64_t data_size) {
  if (!j.is_object()) throw SafetensorsError("tensor '" + name + "': entry is not an object");
  if (!j.contains("dtype") || !j["dtype"].is_string()) throw SafetensorsError("tensor '" + name + "': missing dtype");
  if (!j.contains("shape")) throw SafetensorsError("tensor '" + name + "': missing shape");
  if (!j.contains("data_offsets")) throw SafetensorsError("tensor '" + name + "': missing data_offsets");
  Entry e{name, parse_dtype(name, j["dtype"].get<std::string>()), parse_shape(name, j["shape"]), 0, 0};
  auto& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw SafetensorsError("tensor '" + name + "': data_offsets must be two natural numbers");
  e.begin = off[0].get<std::uint64_t>();
  e.end = off[1].get<std::uint64_t>();
  if (e.begin > e.end || e.end > data_size)
    throw SafetensorsError("tensor '" + name + "': data_offsets [" + std::to_string(e.begin) + ", " +
                           std::to_string(e.end) + ") outside the " + std::to_string(data_size) + " data bytes");
  std::uint64_t numel = 1;
  for (auto d : e.shape) numel *= std::uint64_t(d);
  if (e.end - e.begin != numel * dtype_size(e.dtype))
    throw SafetensorsError("tensor '" + name + "': " + std::to_string(e.end - e.begin) + " bytes for a shape of " +
                           std::to_string(numel) + " " + dtype_tag(e.dtype) + " elements");
  return e;
}

Json parse_header(const std::vector<char>& bytes, std::uint64_t* header_len) {
  if (bytes.size() < 8) throw SafetensorsError("file too short for a safetensors header (" + std::to_string(bytes.size()) + " bytes)");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(std::uint8_t(bytes[i])) << (8 * i);
  if (n > kMaxSafetensorsHeader) throw SafetensorsError("header length " + std::to_string(n) + " exceeds the limit");
  if (n > bytes.size() - 8) throw SafetensorsError("header length " + std::to_string(n) + " runs past the end of the file (truncated?)");
  if (n < 2 || bytes[8] != '{') throw SafetensorsError("header is not a JSON object");
  *header_len = n;
  try {
    return Json::parse(bytes.begin() + 8, bytes.begin() + 8 + std::int64_t(n));
  } catch (const Json::parse_error& e) {
    throw SafetensorsError(std::string("header is not valid JSON: ") + e.what());
  }
}

// Offsets must tile [0, data_size) exactly, in some order: no gap, no overlap.
void check_tiling(std::vector<Entry>& entries, std::uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (auto& e : entries) {
    if (e.begin != at) throw SafetensorsError("tensor '" + e.name + "': data_offsets overlap or leave a gap at byte " + std::to_string(at));
    at = e.end;
  }
  if (at != data_size) throw SafetensorsError("data has " + std::to_string(data_size - at) + " bytes no tensor owns");
}

}  // namespace

const TensorView* SafetensorsFile::find(const std::string& name) const {
  for (auto& [n, t] : tensors) if (n == name) return &t;
  return nullptr;
}

const TensorView& SafetensorsFile::require(const std::string& name, const std::vector<std::int64_t>& shape) const {
  const TensorView* t = find(name);
  if (t == nullptr) throw SafetensorsError("tensor '" + name + "' is missing");
  if (t->shape != shape) {
    std::string got, want;
    for (auto d : t->shape) got += std::to_string(d) + ",";
    for (auto d : shape) want += std::to_string(d) + ",";
    throw SafetensorsError("tensor '" + name + "' has shape [" + got + "], expected [" + want + "]");
  }
  return *t;
}

std::vector<char> serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__" || !seen.insert(name).second)
      throw SafetensorsError("tensor name '" + name + "' is empty, reserved or repeated");
    header[name] = {{"dtype", dtype_tag(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.resize((text.size() + 8 + 7) / 8 * 8 - 8, ' ');   // data starts 8-byte aligned
  std::vector<char> out(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out[i] = char((std::uint64_t(text.size()) >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, text.data(), text.size());
  char* data = out.data() + 8 + text.size();
  for (auto& [name, t] : tensors) {
    if (t.numel() > 0 && t.data == nullptr) throw SafetensorsError("tensor '" + name + "' has no data");
    copy_contiguous(t, data);
    data += t.nbytes();
  }
  return out;
}

SafetensorsFile parse_safetensors(const std::vector<char>& bytes) {
  std::uint64_t n = 0;
  Json header = parse_header(bytes, &n);
  if (!header.is_object()) throw SafetensorsError("header is not a JSON object");
  const std::uint64_t data_size = bytes.size() - 8 - n;
  SafetensorsFile file;
  std::vector<Entry> entries;
  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw SafetensorsError("__metadata__ is not an object");
      for (auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) throw SafetensorsError("__metadata__ value for '" + mk + "' is not a string");
        file.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(key, value, data_size));
  }
  check_tiling(entries, data_size);
  TensorView all = TensorView::empty(DType::U8, {std::int64_t(data_size)});
  if (data_size > 0) std::memcpy(all.data, bytes.data() + 8 + n, data_size);
  for (auto& e : entries) {
    void* p = static_cast<char*>(all.data) + e.begin;
    file.tensors.emplace_back(e.name, TensorView::wrap(p, e.dtype, e.shape, all.keep_alive));
  }
  return file;
}

// Written to a file of its own beside `path` (a name no other writer, thread or process, uses),
// flushed to the disk, then renamed over `path`: a reader, or a crash at any point, finds the old
// file or the new one whole, never a torn one; the directory is synced after the rename (where the
// file system allows), so the new name lasts too. On failure the temporary file is removed.
void write_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  auto bytes = serialize_safetensors(tensors, metadata);
  static std::atomic<std::uint64_t> serial{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw SafetensorsError("cannot create '" + tmp + "': " + std::strerror(errno));
  const auto fail = [&](const std::string& what, int err, bool fd_open) {
    if (fd_open) ::close(fd);
    ::unlink(tmp.c_str());
    throw SafetensorsError(what + ": " + std::strerror(err));
  };
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      fail("cannot write '" + tmp + "'", err, true);
    }
    done += std::size_t(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    fail("cannot flush '" + tmp + "'", err, true);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    fail("cannot close '" + tmp + "'", err, false);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    fail("cannot rename '" + tmp + "' to '" + path + "'", err, false);
  }
  const auto dir = std::filesystem::path(path).parent_path();
  if (const int d = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    (void)::fsync(d);   // best effort: some file systems refuse a directory's fsync
    ::close(d);
  }
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw SafetensorsError("cannot open '" + path + "': " + (ec ? ec.message() : std::string("not a regular file")));
  }
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw SafetensorsError("cannot open '" + path + "'");
  const auto size = f.tellg();
  if (size < 0) throw SafetensorsError("cannot read '" + path + "'");
  std::vector<char> bytes(static_cast<std::size_t>(size));
  f.seekg(0);
  f.read(bytes.data(), size);
  if (!f) throw SafetensorsError("cannot read '" + path + "'");
  try {
    return parse_safetensors(bytes);
  } catch (const SafetensorsError& e) {
    throw SafetensorsError(path + ": " + e.error().message);
  }
}

}  // namespace troupe::actors
