#include "troupe/placement/status.hpp"

namespace troupe::placement {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kInfeasible: return "Infeasible";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(placement::to_string(code_)) + ": " + message_;
}

}  // namespace troupe::placement
