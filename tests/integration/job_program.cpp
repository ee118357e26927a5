// The troupe program the jobs tests (and build/bench/jobs) submit as an entrypoint. A job's worker
// processes run this same binary from their node's copy of the package.
//   job_program connect        joins the cluster as its job and exits 0 (spawns nothing)
//   job_program actors R       prints data.txt from its working directory, calls two actors that
//                              need resources R (placed on the node that has them), which print
//   job_program hold R         two actors needing R and a placement group {R}, then waits for a signal
//   job_program fail N         prints a line and exits with N
//   job_program attempts R     attempt 1: an actor needing R, then waits (its node is killed);
//                              a later attempt prints which it is and exits 0
//   job_program elastic R      an elastic group "echoes" of 1 to 4 members needing R; prints each
//                              epoch's size and its joins, calling every member, until a signal
#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "troupe/troupe.hpp"

struct Echo {
  std::string say(std::string what) {
    std::cout << "echo says " << what << std::endl;   // a worker's output: the job's log, prefixed
    return what + " from pid " + std::to_string(::getpid());
  }
  std::string cwd() {
    char buf[4096];
    return ::getcwd(buf, sizeof buf) != nullptr ? std::string(buf) : std::string();
  }
  std::string exe() {
    char buf[4096];
    const auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, std::size_t(n)) : std::string();
  }
};
TROUPE_ACTOR(Echo, say, cwd, exe);

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

[[noreturn]] void wait_for_signal() {
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);   // a worker process serves here and never returns
  const std::string mode = argc > 1 ? argv[1] : "connect";
  const std::string arg = argc > 2 ? argv[2] : "";
  std::cout << "driver of job " << env("TROUPE_JOB_ID") << " attempt " << env("TROUPE_JOB_ATTEMPT") << " pid "
            << ::getpid() << " mode " << mode << std::endl;
  if (mode == "connect") return 0;
  if (mode == "fail") {
    std::cerr << "failing with " << arg << std::endl;
    return std::atoi(arg.c_str());
  }
  if (mode == "actors") {
    std::ifstream data("data.txt");
    std::stringstream text;
    text << data.rdbuf();
    std::cout << "data.txt: " << text.str() << std::endl;
    for (int i = 0; i < 2; ++i) {
      auto e = rt.spawn<Echo>(troupe::Options{}.name("echo" + std::to_string(i)).process(true).resources(arg));
      std::cout << "reply: " << e.call(&Echo::say, "hi " + std::to_string(i)).get() << std::endl;
      std::cout << "worker cwd: " << e.call(&Echo::cwd).get() << std::endl;
      std::cout << "worker exe: " << e.call(&Echo::exe).get() << std::endl;
    }
    return 0;
  }
  if (mode == "hold") {
    auto group = rt.placement_group({arg});
    if (!group.ready(std::chrono::seconds(10))) {
      std::cerr << "the placement group was not ready" << std::endl;
      return 3;
    }
    auto a = rt.spawn<Echo>(troupe::Options{}.name("held0").process(true).resources(arg));
    auto b = rt.spawn<Echo>(troupe::Options{}.name("held1").process(true).bundle(group, 0));
    std::cout << "holding " << a.call(&Echo::say, "a").get() << " and " << b.call(&Echo::say, "b").get() << std::endl;
    wait_for_signal();
  }
  if (mode == "attempts") {
    if (env("TROUPE_JOB_ATTEMPT") == "1") {
      auto a = rt.spawn<Echo>(troupe::Options{}.name("first").process(true).resources(arg));
      std::cout << "attempt 1 holds " << a.call(&Echo::say, "x").get() << std::endl;
      wait_for_signal();
    }
    std::cout << "attempt " << env("TROUPE_JOB_ATTEMPT") << " ran on node " << env("TROUPE_NODE_ID") << std::endl;
    return 0;
  }
  if (mode == "elastic") {
    auto group = rt.spawn_elastic_group<Echo>(troupe::Elastic{1, 4}.name("echoes"),
                                              troupe::Options{}.name("echo").process(true).resources(arg));
    group.on_join([](const troupe::ActorRef<Echo>& e) {
      std::cout << "joined " << e.call(&Echo::say, "welcome").get() << std::endl;
    });
    group.on_resize([](const std::vector<troupe::ActorRef<Echo>>& before, const std::vector<troupe::ActorRef<Echo>>& now) {
      std::cout << "resize " << before.size() << " -> " << now.size() << std::endl;
    });
    std::size_t shown = 0;
    for (;;) {
      // The size and the replies of one call, so of one epoch (a separate size() could see the next).
      auto replies = group.call_all(&Echo::say, std::string("ping")).result();
      if (replies.ok() && replies->size() != shown) {
        const auto answered = std::count_if(replies->begin(), replies->end(), [](const auto& r) { return r.ok(); });
        std::cout << "size " << replies->size() << " epoch " << group.epoch() << " replies " << answered << std::endl;
        shown = replies->size();
      }
      ::usleep(50000);
    }
  }
  std::cerr << "unknown mode " << mode << std::endl;
  return 2;
}
