#include "troupe/error.hpp"

#include <array>
#include <span>

namespace troupe {
namespace {

// Each domain's code names, indexed by value (index 0 of a domain other than Core is unused).
constexpr std::array<std::string_view, 8> kCore = {"Ok", "ActorDied", "Timeout", "Unavailable", "BadArguments",
                                                   "MethodFailed", "Cancelled", "Internal"};
constexpr std::array<std::string_view, 7> kPlacement = {"", "InvalidArgument", "NotFound", "AlreadyExists",
                                                        "Infeasible", "Unavailable", "FailedPrecondition"};
constexpr std::array<std::string_view, 4> kKernels = {"", "BadArguments", "Unavailable", "DeviceError"};
constexpr std::array<std::string_view, 6> kTransport = {"", "BadDescriptor", "PeerGone", "Timeout", "Released", "Ucx"};
constexpr std::array<std::string_view, 5> kWeights = {"", "NotFound", "Checksum", "Transfer", "Rejoin"};
constexpr std::array<std::string_view, 6> kControl = {"", "Store", "BadRequest", "NotFound", "Conflict", "TooLarge"};
constexpr std::array<std::string_view, 3> kNet = {"", "Unreachable", "Refused"};

struct DomainInfo {
  std::string_view name;
  std::span<const std::string_view> codes;
};

constexpr std::array<DomainInfo, 7> kDomains = {{
    {"core", kCore}, {"placement", kPlacement}, {"kernels", kKernels}, {"transport", kTransport},
    {"weights", kWeights}, {"control", kControl}, {"net", kNet},
}};

// The code's name, or "" when its domain defines no such value.
std::string_view code_name(ErrorDomain domain, std::uint16_t value) {
  auto d = static_cast<std::size_t>(domain);
  if (d >= kDomains.size()) return {};
  auto codes = kDomains[d].codes;
  return value < codes.size() ? codes[value] : std::string_view{};
}

}  // namespace

Code Code::from_wire(std::uint8_t domain, std::uint16_t value) noexcept {
  Code c;
  if (code_name(static_cast<ErrorDomain>(domain), value).empty()) return c;
  c.domain_ = static_cast<ErrorDomain>(domain);
  c.value_ = value;
  return c;
}

std::string_view to_string(ErrorDomain domain) {
  auto d = static_cast<std::size_t>(domain);
  return d < kDomains.size() ? kDomains[d].name : std::string_view("unknown");
}

std::string_view to_string(ErrorCode code) {
  auto name = code_name(ErrorDomain::Core, static_cast<std::uint16_t>(code));
  return name.empty() ? std::string_view("Unknown") : name;
}

std::string to_string(Code code) {
  auto name = code_name(code.domain(), code.value());
  std::string text = name.empty() ? "Unknown(" + std::to_string(code.value()) + ")" : std::string(name);
  if (code.domain() == ErrorDomain::Core) return text;
  return std::string(to_string(code.domain())) + "." + text;
}

std::string Error::to_string() const {
  std::string s = troupe::to_string(code);
  if (!message.empty()) s += ": " + message;
  return s;
}

}  // namespace troupe
