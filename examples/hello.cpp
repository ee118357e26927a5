// examples/hello: the actor API in one page. A counter actor, a group of them, futures, errors,
// and one actor in a worker process (on the cluster given by --address, else an embedded one).
#include <unistd.h>

#include <iostream>
#include <stdexcept>
#include <string>

#include "troupe/troupe.hpp"

struct Counter {
  int n = 0;
  explicit Counter(int start) : n(start) {}
  int add(int k) { return n += k; }
  std::string greet(std::string who) { return "hello " + who + " from counter at " + std::to_string(n); }
  int fail() { throw std::runtime_error("this method always throws"); }
  int pid() { return int(::getpid()); }
};
TROUPE_ACTOR(Counter, add, greet, fail, pid);

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);

  auto c = rt.spawn<Counter>(troupe::Options{}.name("counter"), 10);
  std::cout << "add(5) -> " << c.call(&Counter::add, 5).get() << "\n";
  std::cout << c.call(&Counter::greet, "troupe").get() << "\n";
  // Call and wait in one: an idle actor of this process runs it on this thread, no hand-over.
  std::cout << "call_sync add(1) -> " << c.call_sync(&Counter::add, 1) << "\n";

  auto group = rt.spawn_group<Counter>(4, troupe::Options{}, 0);
  auto all = group.call_all(&Counter::add, 1).get();
  std::cout << "group of " << group.size() << " answered " << all.size() << " results\n";
  auto shards = group.scatter(&Counter::add, std::vector<int>{1, 2, 3, 4}).get();
  std::cout << "scatter -> " << shards[0] << " " << shards[1] << " " << shards[2] << " " << shards[3] << "\n";

  auto failed = c.call(&Counter::fail).result();
  std::cout << "a throwing method -> " << failed.error().to_string() << "\n";

  auto remote = rt.spawn<Counter>(troupe::Options{}.name("remote").process(true).max_restarts(1), 100);
  std::cout << "remote add(1) -> " << remote.call(&Counter::add, 1).get() << " in worker process "
            << remote.call(&Counter::pid).get() << " (driver is " << ::getpid() << ")\n";

  rt.kill(c);
  auto dead = c.call(&Counter::add, 1).result();
  std::cout << "after kill -> " << dead.error().to_string() << "\n";
  return 0;
}
