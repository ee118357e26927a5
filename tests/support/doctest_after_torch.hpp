// ATen's headers (c10's logging) define CHECK as their own fatal check, replacing doctest's: a
// failure then aborts the binary instead of being reported, and doctest counts nothing. A test
// file that includes ATen includes this after it, to have doctest's CHECK back.
#pragma once

#include <doctest/doctest.h>

#undef CHECK
#define CHECK DOCTEST_CHECK
