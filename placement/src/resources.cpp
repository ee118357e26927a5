#include "troupe/placement/resources.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace troupe::placement {
namespace {

// Process-wide name table. The deque keeps string addresses stable for the map's views.
struct NameTable {
  std::mutex mu;
  std::deque<std::string> names{"CPU", "GPU", "memory"};
  std::unordered_map<std::string_view, ResourceId> ids{{"CPU", kCpu}, {"GPU", kGpu}, {"memory", kMemory}};
};

NameTable& table() {
  static NameTable t;
  return t;
}

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '.' ||
         c == '-' || c == '/';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Suffix multiplier (binary), or 0 when the suffix is unknown.
std::int64_t suffix_multiplier(std::string_view suffix) {
  if (suffix.empty()) return 1;
  if (suffix.size() == 2 && suffix[1] == 'i') suffix.remove_suffix(1);
  if (suffix.size() != 1) return 0;
  switch (suffix[0]) {
    case 'K': return std::int64_t{1} << 10;
    case 'M': return std::int64_t{1} << 20;
    case 'G': return std::int64_t{1} << 30;
    case 'T': return std::int64_t{1} << 40;
    default: return 0;
  }
}

Result<Quantity> parse_value(std::string_view v) {
  std::size_t i = 0;
  __int128 units = 0;
  auto digit = [&](std::size_t k) { return k < v.size() && std::isdigit(static_cast<unsigned char>(v[k])); };
  if (!digit(0)) return Error{PlacementCode::InvalidArgument, "'" + std::string(v) + "' is not a non-negative number"};
  for (; digit(i); ++i) {
    units = units * 10 + (v[i] - '0');
    if (units > std::numeric_limits<std::int64_t>::max()) return Error{PlacementCode::InvalidArgument, "'" + std::string(v) + "' is too large"};
  }
  units *= Quantity::kScale;
  if (i < v.size() && v[i] == '.') {
    ++i;
    if (!digit(i)) return Error{PlacementCode::InvalidArgument, "'" + std::string(v) + "' has no digits after '.'"};
    std::int64_t place = Quantity::kScale / 10;
    for (; digit(i); ++i, place /= 10) {
      if (place == 0) return Error{PlacementCode::InvalidArgument, "'" + std::string(v) + "' is finer than 0.0001"};
      units += (v[i] - '0') * place;
    }
  }
  const std::int64_t mult = suffix_multiplier(v.substr(i));
  if (mult == 0) return Error{PlacementCode::InvalidArgument, "'" + std::string(v) + "' has an unknown suffix (use K, M, G, T)"};
  units *= mult;
  if (units > std::numeric_limits<std::int64_t>::max()) return Error{PlacementCode::InvalidArgument, "'" + std::string(v) + "' is too large"};
  return Quantity::from_units(static_cast<std::int64_t>(units));
}

std::string format_plain(std::int64_t units) {
  const bool neg = units < 0;
  const std::uint64_t u = neg ? -static_cast<std::uint64_t>(units) : units;
  std::string out = (neg ? "-" : "") + std::to_string(u / Quantity::kScale);
  std::uint64_t frac = u % Quantity::kScale;
  if (frac == 0) return out;
  std::string f = std::to_string(frac + Quantity::kScale).substr(1);  // zero-padded to 4 digits
  while (f.back() == '0') f.pop_back();
  return out + "." + f;
}

std::string format_value(const std::string& name, Quantity q) {
  if (name.find("memory") != std::string::npos && q.is_whole() && q.units() > 0) {
    const std::int64_t bytes = q.units() / Quantity::kScale;
    static constexpr std::pair<int, char> kSuffixes[] = {{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}};
    for (auto [shift, c] : kSuffixes)
      if (bytes % (std::int64_t{1} << shift) == 0) return std::to_string(bytes >> shift) + c;
  }
  return format_plain(q.units());
}

int canonical_rank(const std::string& name) {
  if (name == "CPU") return 0;
  if (name == "GPU") return 1;
  if (name == "memory") return 2;
  return 3;
}

}  // namespace

Quantity Quantity::from_double(double value) {
  return Quantity(static_cast<std::int64_t>(std::llround(value * kScale)));
}

ResourceId intern_resource(std::string_view name) {
  NameTable& t = table();
  std::lock_guard lock(t.mu);
  if (auto it = t.ids.find(name); it != t.ids.end()) return it->second;
  t.names.emplace_back(name);
  const auto id = static_cast<ResourceId>(t.names.size() - 1);
  t.ids.emplace(t.names.back(), id);
  return id;
}

std::string resource_name(ResourceId id) {
  NameTable& t = table();
  std::lock_guard lock(t.mu);
  return id < t.names.size() ? t.names[id] : "resource#" + std::to_string(id);
}

Result<Resources> Resources::parse(std::string_view text) {
  Resources out;
  if (trim(text).empty()) return out;
  auto fail = [&](std::size_t n, std::string_view item, const std::string& why) {
    return Error{PlacementCode::InvalidArgument, "resource string '" + std::string(text) + "': item " +
                                                    std::to_string(n) + " ('" + std::string(item) + "'): " + why};
  };
  std::size_t n = 0;
  for (std::size_t start = 0; start <= text.size(); ++n) {
    std::size_t end = std::min(text.find(',', start), text.size());
    std::string_view item = trim(text.substr(start, end - start));
    start = end + 1;
    if (item.empty()) return fail(n, item, "empty item (stray comma?)");
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) return fail(n, item, "expected name=value");
    std::string_view name = trim(item.substr(0, eq));
    if (name.empty() || !is_name_start(name[0]) || !std::all_of(name.begin(), name.end(), is_name_char))
      return fail(n, item, "bad name '" + std::string(name) + "' (letters, digits, _ : . - /; not starting with a digit)");
    auto value = parse_value(trim(item.substr(eq + 1)));
    if (!value.ok()) return fail(n, item, value.error().message);
    const ResourceId id = intern_resource(name);
    for (const Entry& e : out.entries_)
      if (e.id == id) return fail(n, item, "'" + std::string(name) + "' given twice");
    // Zero is legal and means absent; keep the id so duplicates are still caught.
    out.entries_.push_back({id, *value});
    if (end == text.size()) break;
  }
  std::erase_if(out.entries_, [](const Entry& e) { return e.amount.units() == 0; });
  std::sort(out.entries_.begin(), out.entries_.end(), [](const Entry& a, const Entry& b) { return a.id < b.id; });
  return out;
}

Resources Resources::must_parse(std::string_view text) {
  auto r = parse(text);
  if (!r.ok()) throw std::invalid_argument(r.error().message);
  return std::move(r).value();
}

Resources& Resources::set(ResourceId id, Quantity amount) {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), id, [](const Entry& e, ResourceId k) { return e.id < k; });
  if (it != entries_.end() && it->id == id) {
    if (amount.units() == 0) entries_.erase(it);
    else it->amount = amount;
  } else if (amount.units() != 0) {
    entries_.insert(it, {id, amount});
  }
  return *this;
}

Quantity Resources::get(ResourceId id) const {
  for (const Entry& e : entries_)
    if (e.id == id) return e.amount;
  return {};
}

bool Resources::fits_in(const Resources& available) const {
  auto a = available.entries_.begin();
  for (const Entry& e : entries_) {
    while (a != available.entries_.end() && a->id < e.id) ++a;
    const Quantity have = (a != available.entries_.end() && a->id == e.id) ? a->amount : Quantity{};
    if (e.amount > have) return false;
  }
  return true;
}

bool Resources::any_negative() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.amount.units() < 0; });
}

bool Resources::names_subset_of(const Resources& other) const {
  auto a = other.entries_.begin();
  for (const Entry& e : entries_) {
    while (a != other.entries_.end() && a->id < e.id) ++a;
    if (a == other.entries_.end() || a->id != e.id) return false;
  }
  return true;
}

template <class Op>
void Resources::merge(const Resources& other, Op op) {
  std::vector<Entry> out;
  out.reserve(entries_.size() + other.entries_.size());
  auto a = entries_.begin();
  auto b = other.entries_.begin();
  while (a != entries_.end() || b != other.entries_.end()) {
    if (b == other.entries_.end() || (a != entries_.end() && a->id < b->id)) {
      out.push_back(*a++);
    } else if (a == entries_.end() || b->id < a->id) {
      out.push_back({b->id, op(Quantity{}, b->amount)});
      ++b;
    } else {
      out.push_back({a->id, op(a->amount, b->amount)});
      ++a, ++b;
    }
    if (out.back().amount.units() == 0) out.pop_back();
  }
  entries_ = std::move(out);
}

Resources& Resources::operator+=(const Resources& other) {
  merge(other, [](Quantity x, Quantity y) { return x + y; });
  return *this;
}

Resources& Resources::operator-=(const Resources& other) {
  merge(other, [](Quantity x, Quantity y) { return x - y; });
  return *this;
}

std::string Resources::to_string() const {
  std::vector<std::pair<std::string, Quantity>> named;
  for (const Entry& e : entries_) named.emplace_back(resource_name(e.id), e.amount);
  std::sort(named.begin(), named.end(), [](const auto& x, const auto& y) {
    return std::pair(canonical_rank(x.first), x.first) < std::pair(canonical_rank(y.first), y.first);
  });
  std::string out;
  for (const auto& [name, q] : named) {
    if (!out.empty()) out += ',';
    out += name + "=" + format_value(name, q);
  }
  return out;
}

}  // namespace troupe::placement
