// The same call patterns on bare CAF request/response (detached actors, as troupe's default),
// measured in the same run so troupe's overhead is a ratio, not a guess.
#pragma once

#include <map>
#include <string>

namespace bench {
std::map<std::string, double> run_raw_caf(double seconds_per_case);
}
