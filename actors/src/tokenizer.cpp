#include "troupe/actors/tokenizer.hpp"

#include <stdexcept>

namespace troupe::actors {

CharTokenizer::CharTokenizer(std::string alphabet) : alphabet_(std::move(alphabet)) {
  ids_.fill(-1);
  for (std::size_t i = 0; i < alphabet_.size(); ++i) {
    auto c = static_cast<unsigned char>(alphabet_[i]);
    if (ids_[c] != -1) throw std::invalid_argument(std::string("CharTokenizer: repeated character '") + alphabet_[i] + "'");
    ids_[c] = std::int32_t(i) + kFirstChar;
  }
}

std::vector<std::int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size());
  for (char ch : text) {
    std::int32_t id = ids_[static_cast<unsigned char>(ch)];
    if (id < 0) throw std::invalid_argument(std::string("CharTokenizer: character '") + ch + "' not in the alphabet");
    out.push_back(id);
  }
  return out;
}

std::string CharTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (auto id : ids) {
    if (id < 0 || id >= vocab_size()) throw std::out_of_range("CharTokenizer: id " + std::to_string(id) + " outside the vocabulary");
    if (id >= kFirstChar) out.push_back(alphabet_[std::size_t(id - kFirstChar)]);
  }
  return out;
}

}  // namespace troupe::actors
