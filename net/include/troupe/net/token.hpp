// The cluster token: made once per cluster, presented by every troupe process and client, and
// compared in constant time (SEC-1).
#pragma once

#include <string>

namespace troupe::net {

// 32 hex characters from the kernel's random source.
std::string random_token();

// Compares a presented token with the cluster's in constant time (no prefix leaks through
// timing). SEC-1's one check, used by the head, worker gateways and actor hosts.
bool token_matches(const std::string& given, const std::string& expected);

}  // namespace troupe::net
