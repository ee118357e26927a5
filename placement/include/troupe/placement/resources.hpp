// Named resource quantities in fixed point, and their text form.
//
// A Quantity counts units of 1/10,000 (Ray's granularity), so ten 0.1 GPU requests add up
// to exactly 1 GPU and no placement decision depends on float rounding. A Resources maps
// interned names (CPU, GPU, memory, any custom name such as "accel_type:H200") to Quantities.
//
// Text form: "CPU=4,GPU=0.5,memory=16G,accel_type:H200=1".
//   name   [A-Za-z_][A-Za-z0-9_:.\-/]*, each name at most once
//   value  digits [. up to 4 digits] [K|M|G|T|Ki|Mi|Gi|Ti]   (binary multiples: G = 2^30)
// Whitespace around items is ignored; "" is the empty set. Memory is counted in bytes.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/placement/status.hpp"

namespace troupe::placement {

// A non-negative or negative amount in units of 1/kScale. Arithmetic is exact.
class Quantity {
 public:
  static constexpr std::int64_t kScale = 10'000;

  constexpr Quantity() = default;
  static constexpr Quantity from_units(std::int64_t units) { return Quantity(units); }
  static constexpr Quantity whole(std::int64_t n) { return Quantity(n * kScale); }
  // Rounds to the nearest unit: from_double(0.1) is exactly 1,000 units.
  static Quantity from_double(double value);

  constexpr std::int64_t units() const { return units_; }
  double to_double() const { return static_cast<double>(units_) / kScale; }
  constexpr bool is_whole() const { return units_ % kScale == 0; }

  constexpr Quantity operator+(Quantity o) const { return Quantity(units_ + o.units_); }
  constexpr Quantity operator-(Quantity o) const { return Quantity(units_ - o.units_); }
  constexpr Quantity& operator+=(Quantity o) { units_ += o.units_; return *this; }
  constexpr Quantity& operator-=(Quantity o) { units_ -= o.units_; return *this; }
  constexpr auto operator<=>(const Quantity&) const = default;

 private:
  constexpr explicit Quantity(std::int64_t units) : units_(units) {}
  std::int64_t units_ = 0;
};

// Names are interned process-wide into small ids; interning is thread-safe and ids are
// stable for the life of the process (never serialize them: send names).
using ResourceId = std::uint32_t;
inline constexpr ResourceId kCpu = 0;
inline constexpr ResourceId kGpu = 1;
inline constexpr ResourceId kMemory = 2;
ResourceId intern_resource(std::string_view name);
std::string resource_name(ResourceId id);

class Resources {
 public:
  struct Entry {
    ResourceId id;
    Quantity amount;
    bool operator==(const Entry&) const = default;
  };

  Resources() = default;
  // Parses the text form; the error message quotes the offending item and says what is wrong.
  static Result<Resources> parse(std::string_view text);
  // As parse(), but throws std::invalid_argument with the same message. For literals in
  // tests, benchmarks and configuration defaults, never for peer input.
  static Resources must_parse(std::string_view text);

  // Sets (replaces) an amount; a zero amount removes the name.
  Resources& set(ResourceId id, Quantity amount);
  Resources& set(std::string_view name, Quantity amount) { return set(intern_resource(name), amount); }
  Quantity get(ResourceId id) const;
  Quantity get(std::string_view name) const { return get(intern_resource(name)); }

  bool empty() const { return entries_.empty(); }
  // Entries sorted by id, none zero.
  const std::vector<Entry>& entries() const { return entries_; }
  // True when every amount here is <= the same name's amount in `available`.
  bool fits_in(const Resources& available) const;
  // True when some amount is negative (only reachable through subtraction).
  bool any_negative() const;
  // True when every name here also appears (non-zero) in `other`.
  bool names_subset_of(const Resources& other) const;

  Resources& operator+=(const Resources& other);
  Resources& operator-=(const Resources& other);
  friend Resources operator+(Resources a, const Resources& b) { return a += b; }
  friend Resources operator-(Resources a, const Resources& b) { return a -= b; }
  bool operator==(const Resources&) const = default;

  // Canonical text: CPU, GPU, memory first, then other names alphabetically; names containing
  // "memory" print with the largest exact binary suffix. parse(to_string()) round-trips.
  std::string to_string() const;

 private:
  template <class Op>
  void merge(const Resources& other, Op op);
  std::vector<Entry> entries_;
};

}  // namespace troupe::placement
