// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range, then the bytes.
// The reader trusts nothing: it checks the header length, the JSON, every dtype, shape and offset,
// that byte ranges match the shapes, and that they tile the data with no gap or overlap. Any
// violation throws SafetensorsError whose message names the tensor and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

namespace troupe::actors {

// A file that is not valid safetensors, or cannot be read or written: BadArguments, with the tensor
// and the problem in the message.
class SafetensorsError : public ErrorException {
 public:
  explicit SafetensorsError(const std::string& what) : ErrorException(Error{ErrorCode::BadArguments, what}) {}
};

using NamedTensors = std::vector<std::pair<std::string, TensorView>>;

struct SafetensorsFile {
  NamedTensors tensors;                          // in file order (by offset)
  std::map<std::string, std::string> metadata;   // the optional "__metadata__" object

  // The tensor called `name`, or nullptr.
  const TensorView* find(const std::string& name) const;
  // The tensor called `name`; throws SafetensorsError if it is absent or its shape differs.
  const TensorView& require(const std::string& name, const std::vector<std::int64_t>& shape) const;
};

// Hard limit on the JSON header (the reference implementation uses 100 MB).
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100u << 20;

// Serialises tensors (any strides; written contiguous). Names must be unique and non-empty.
std::vector<char> serialize_safetensors(const NamedTensors& tensors,
                                        const std::map<std::string, std::string>& metadata = {});
// Parses a whole file's bytes. The returned views share one aligned copy of the data.
SafetensorsFile parse_safetensors(const std::vector<char>& bytes);

// Writes to `path` atomically (a temporary file, then rename). Throws SafetensorsError on I/O errors.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace troupe::actors
