// Text <-> token ids. Every tokenizer reserves id 0 for padding and has one end-of-sequence id
// (the stop token of generation). A BPE tokenizer can implement the same interface later.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws std::invalid_argument for text the vocabulary cannot express.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // Special ids (pad, eos) decode to nothing; an id outside the vocabulary throws std::out_of_range.
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  std::string decode(std::initializer_list<std::int32_t> ids) const { return decode(std::span(ids.begin(), ids.size())); }
  virtual std::int32_t vocab_size() const = 0;
  std::int32_t pad_id() const { return 0; }
  virtual std::int32_t eos_id() const = 0;
};

// One id per character of `alphabet`, after pad (0) and eos (1). For the synthetic tasks:
// CharTokenizer("0123456789+=") has 14 ids.
class CharTokenizer final : public Tokenizer {
 public:
  explicit CharTokenizer(std::string alphabet);   // throws on a repeated character
  std::vector<std::int32_t> encode(std::string_view text) const override;
  using Tokenizer::decode;
  std::string decode(std::span<const std::int32_t> ids) const override;
  std::int32_t vocab_size() const override { return std::int32_t(alphabet_.size()) + kFirstChar; }
  std::int32_t eos_id() const override { return 1; }
  const std::string& alphabet() const { return alphabet_; }

 private:
  static constexpr std::int32_t kFirstChar = 2;
  std::string alphabet_;
  std::array<std::int32_t, 256> ids_{};   // char -> id, -1 if absent
};

}  // namespace troupe::actors
