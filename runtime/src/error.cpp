#include "troupe/error.hpp"

namespace troupe {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::Ok: return "Ok";
    case ErrorCode::ActorDied: return "ActorDied";
    case ErrorCode::Timeout: return "Timeout";
    case ErrorCode::Unavailable: return "Unavailable";
    case ErrorCode::BadArguments: return "BadArguments";
    case ErrorCode::MethodFailed: return "MethodFailed";
    case ErrorCode::Cancelled: return "Cancelled";
    case ErrorCode::Internal: return "Internal";
  }
  return "Unknown";
}

std::string Error::to_string() const {
  std::string s(troupe::to_string(code));
  if (!message.empty()) s += ": " + message;
  return s;
}

}  // namespace troupe
