#include "troupe/actors/types.hpp"

#include <stdexcept>
#include <string>

namespace troupe::actors {

TokenRows::TokenRows(std::initializer_list<std::vector<std::int32_t>> rows) {
  for (const auto& r : rows) push_back(r);
}

TokenRows::TokenRows(const std::vector<std::vector<std::int32_t>>& rows) {
  std::size_t n = 0;
  for (const auto& r : rows) n += r.size();
  reserve(rows.size(), n);
  for (const auto& r : rows) push_back(r);
}

std::span<const std::int32_t> TokenRows::at(std::size_t i) const {
  if (i >= size()) throw std::out_of_range("TokenRows: row " + std::to_string(i) + " of " + std::to_string(size()));
  return (*this)[i];
}

void TokenRows::push_back(std::span<const std::int32_t> row) {
  values_.insert(values_.end(), row.begin(), row.end());
  offsets_.push_back(std::int64_t(values_.size()));
}

void TokenRows::reserve(std::size_t rows, std::size_t values) {
  offsets_.reserve(rows + 1);
  values_.reserve(values);
}

std::vector<std::vector<std::int32_t>> TokenRows::to_vectors() const {
  std::vector<std::vector<std::int32_t>> out;
  out.reserve(size());
  for (auto row : *this) out.emplace_back(row.begin(), row.end());
  return out;
}

void TokenRows::msgpack_unpack(const msgpack::object& o) {
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 2) throw msgpack::type_error();
  TokenRows t;
  o.via.array.ptr[0].convert(t.values_);
  o.via.array.ptr[1].convert(t.offsets_);
  if (t.offsets_.empty() || t.offsets_.front() != 0 || t.offsets_.back() != std::int64_t(t.values_.size()))
    throw msgpack::type_error();
  for (std::size_t i = 1; i < t.offsets_.size(); ++i)
    if (t.offsets_[i] < t.offsets_[i - 1]) throw msgpack::type_error();
  *this = std::move(t);
}

}  // namespace troupe::actors
