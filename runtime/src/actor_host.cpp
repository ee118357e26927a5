#include "actor_host.hpp"

#include <caf/all.hpp>

#include "cluster/call_channel.hpp"
#include "cluster/http.hpp"

namespace troupe::detail {
namespace {

struct HostState {
  void* object = nullptr;
  const ActorTypeInfo* type = nullptr;
  HostContext ctx;
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

// Runs `method` on the object; the reply payload, or the error it failed with.
Result<Payload> invoke(Host* self, const std::string& label, const std::string& method, const Payload& args) {
  const ActorTypeInfo& type = *self->state.type;
  const MethodInfo* m = type.find_method(method);
  if (m == nullptr) return Error{ErrorCode::BadArguments, "no method '" + method + "' on " + type.name};
  try {
    return m->invoke(self->state.object, args);
  } catch (const DecodeError& e) {
    return Error{ErrorCode::BadArguments, "arguments of " + type.name + "." + method + ": " + e.what()};
  } catch (...) {
    return Error{ErrorCode::MethodFailed, label + "." + method + " threw: " + describe_current_exception()};
  }
}

void run_local(Host* self, ActorCell& cell, const CallMsg& m) {
  if (cell.dead()) return;   // killed while queued: its future has failed already
  auto r = invoke(self, cell.label(), m.method, m.args);
  if (r.ok()) cell.complete(*m.call, r.value()); else cell.fail_call(*m.call, r.error());
}

// A call from another process; the reply goes back on its channel (`sink`) or, when it came
// through the middleman, to the caller's router.
void run_remote(Host* self, ActorCell& cell, WireCall& wc, ReplySink* sink) {
  WireReply reply;
  reply.actor_id = wc.actor_id;
  reply.incarnation = wc.incarnation;
  reply.seq = wc.seq;
  reply.gateway = self->state.ctx.gateway;
  auto fail = [&](const Error& e) { reply.code = static_cast<std::int32_t>(e.code); reply.error = e.message; };
  // Callers reach hosts directly: check here too. Hosts outside worker processes take none.
  if (self->state.ctx.token.empty() || !cluster::token_matches(wc.token, self->state.ctx.token)) {
    fail(Error{ErrorCode::Unavailable, "refused: missing or wrong cluster token"});
  } else if (wc.incarnation != self->state.ctx.incarnation) {   // FT-2
    fail(Error{ErrorCode::ActorDied, cell.label() + " incarnation " + std::to_string(wc.incarnation) + " is gone"});
  } else if (cell.dead()) {
    fail(Error{ErrorCode::ActorDied, cell.label() + " stopped"});
  } else {
    try {
      Payload args = from_wire(std::move(wc.args), wc.tensors, self->state.ctx.fetch_timeout);
      auto r = invoke(self, cell.label(), wc.method, args);
      if (r.ok()) {
        WirePayload out = to_wire(r.value());
        reply.result = std::move(out.bytes);
        reply.tensors = std::move(out.tensors);
      } else {
        fail(r.error());
      }
    } catch (const CallError& e) {
      fail(e.error());
    } catch (const DecodeError& e) {
      fail(Error{ErrorCode::BadArguments, std::string("arguments: ") + e.what()});
    } catch (const std::exception& e) {
      fail(Error{ErrorCode::Internal, std::string("could not send the result: ") + e.what()});
    }
  }
  if (sink != nullptr) sink->reply(reply);
  else if (wc.reply_to) caf::anon_send(wc.reply_to, std::move(reply));
}

caf::behavior host(Host* self, std::shared_ptr<ActorCell> cell, const ActorTypeInfo* type, Factory factory,
                   Payload ctor_args, HostContext ctx) {
  self->state.type = type;
  self->state.ctx = std::move(ctx);
  // Whatever stops the host (kill, shutdown, constructor failure), no call may wait on it.
  self->attach_functor([cell](const caf::error&) { cell->mark_dead("stopped"); });
  try {
    self->state.object = factory(ctor_args);
  } catch (...) {
    cell->mark_dead("died: its constructor threw: " + describe_current_exception());
    self->quit();
    return {};
  }
  cell->set_ready();
  return {
      [self, cell](const CallMsg& m) { run_local(self, *cell, m); },
      [self, cell](WireCall& wc) { run_remote(self, *cell, wc, nullptr); },
      [self, cell](ChannelCall& cc) { run_remote(self, *cell, cc.call, cc.sink.get()); },
  };
}

}  // namespace

caf::actor spawn_host(caf::actor_system& sys, bool detached, std::shared_ptr<ActorCell> cell,
                      const ActorTypeInfo& type, Factory factory, Payload ctor_args, HostContext ctx) {
  if (detached) {
    return sys.spawn<caf::detached>(host, std::move(cell), &type, factory, std::move(ctor_args), std::move(ctx));
  }
  return sys.spawn(host, std::move(cell), &type, factory, std::move(ctor_args), std::move(ctx));
}

}  // namespace troupe::detail
