// troupe/proc_file.hpp: /proc/<pid>/stat's fields after a command name that may hold spaces and
// parentheses (the net link's pid-reuse check and the RL benches' worker lookup read them).
#include <doctest/doctest.h>

#include <sys/prctl.h>
#include <unistd.h>

#include <string>

#include "troupe/proc_file.hpp"

TEST_CASE("proc_stat_fields: state, ppid and starttime of a live process whatever its name, and none for a gone one") {
  char old_name[17] = {};
  ::prctl(PR_GET_NAME, old_name);
  ::prctl(PR_SET_NAME, "a) b (c");   // spaces and parentheses in the command name
  const auto fields = troupe::proc_stat_fields(::getpid());
  ::prctl(PR_SET_NAME, old_name);
  REQUIRE(fields.size() >= 20);
  CHECK(fields[0].size() == 1);                          // field 3, the state: one letter
  CHECK(fields[1] == std::to_string(::getppid()));       // field 4
  CHECK(std::stoull(fields[19]) > 0);                    // field 22, starttime in clock ticks
  CHECK(fields.back().find('\n') == std::string::npos);  // the file's last newline is no field's
  CHECK(troupe::proc_stat_fields(0).empty());            // no /proc/0
  CHECK(troupe::proc_stat_fields(-1).empty());
}
