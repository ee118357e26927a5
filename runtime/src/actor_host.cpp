#include "actor_host.hpp"

#include <caf/all.hpp>

namespace troupe::detail {
namespace {

struct HostState {
  void* object = nullptr;
  const ActorTypeInfo* type = nullptr;
  HostState() = default;
  HostState(const HostState&) = delete;
  ~HostState() {
    if (object != nullptr) type->destroy(object);   // on the host's thread, at its exit
  }
};

using Host = caf::stateful_actor<HostState>;

std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

void run_call(Host* self, ActorCell& cell, const CallMsg& m) {
  if (cell.dead()) return;   // killed while queued: its future has failed already
  const ActorTypeInfo& type = *self->state.type;
  const MethodInfo* method = type.find_method(m.method);
  if (method == nullptr) {
    cell.fail_call(*m.call, Error{ErrorCode::BadArguments, "no method '" + m.method + "' on " + type.name});
    return;
  }
  try {
    Payload reply = method->invoke(self->state.object, m.args);
    cell.complete(*m.call, reply);
  } catch (const DecodeError& e) {
    cell.fail_call(*m.call, Error{ErrorCode::BadArguments,
                                "arguments of " + type.name + "." + m.method + ": " + e.what()});
  } catch (...) {
    cell.fail_call(*m.call, Error{ErrorCode::MethodFailed,
                                cell.label() + "." + m.method + " threw: " + describe_current_exception()});
  }
}

caf::behavior host(Host* self, std::shared_ptr<ActorCell> cell, const ActorTypeInfo* type, Factory factory,
                   Payload ctor_args) {
  self->state.type = type;
  // Whatever stops the host (kill, shutdown, constructor failure), no call may wait on it.
  self->attach_functor([cell](const caf::error&) { cell->mark_dead("stopped"); });
  try {
    self->state.object = factory(ctor_args);
  } catch (...) {
    cell->mark_dead("died: its constructor threw: " + describe_current_exception());
    self->quit();
    return {};
  }
  return {
      [self, cell](const CallMsg& m) { run_call(self, *cell, m); },
  };
}

}  // namespace

caf::actor spawn_host(caf::actor_system& sys, bool detached, std::shared_ptr<ActorCell> cell,
                      const ActorTypeInfo& type, Factory factory, Payload ctor_args) {
  if (detached) return sys.spawn<caf::detached>(host, std::move(cell), &type, factory, std::move(ctor_args));
  return sys.spawn(host, std::move(cell), &type, factory, std::move(ctor_args));
}

}  // namespace troupe::detail
