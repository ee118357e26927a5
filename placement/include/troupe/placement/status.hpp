// placement/ reports every failure as a troupe::Error with a PlacementCode (troupe/error.hpp, which
// says for each code whether a retry can help), through troupe::Result<T> and troupe::Status. None
// of its calls throws, but for the one documented exception, Resources::must_parse.
#pragma once

#include "troupe/error.hpp"
