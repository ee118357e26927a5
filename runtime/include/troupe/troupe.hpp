// troupe: the one header users need for actors, futures, groups and options.
//
//   struct Counter { int n = 0; int add(int k) { return n += k; } };
//   TROUPE_ACTOR(Counter, add);
//
//   auto rt = troupe::init(argc, argv);
//   auto c = rt.spawn<Counter>(troupe::Options{});
//   int v = c.call(&Counter::add, 5).get();
#pragma once

#include "troupe/actor_ref.hpp"
#include "troupe/codec.hpp"
#include "troupe/elastic.hpp"
#include "troupe/error.hpp"
#include "troupe/future.hpp"
#include "troupe/options.hpp"
#include "troupe/registry.hpp"
#include "troupe/runtime.hpp"
#include "troupe/share_thread.hpp"
#include "troupe/tensor.hpp"
