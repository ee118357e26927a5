// The start time of a process as /proc shows it. With the pid it names one process for good: a
// pid can be reused, the pair cannot. Weight holds tied to a mapping subscriber's life use it.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::detail::weights {

inline constexpr const char* kStartUnknown = "?";   // the process could not be looked at

// Field 22 of /proc/<pid>/stat; "" when the process is gone (or a zombie), kStartUnknown when
// /proc cannot tell (out of descriptors, ...). Defined in publisher.cpp.
std::string process_start(std::uint32_t pid);

}  // namespace troupe::detail::weights
