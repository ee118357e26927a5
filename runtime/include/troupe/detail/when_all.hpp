// when_all and when_all_results: complete once every input has.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

namespace troupe {
namespace detail {

// Calls finish(inputs) once every input future has completed (at once for none); R is the
// returned future's type, set by finish through the promise it is given.
template <class R, class T, class Finish>
Future<R> join_all(std::vector<Future<T>> fs, Finish finish) {
  // The join keeps an input only once it has completed (each callback stores its own), so an input
  // that never completes holds the join through its callback but is not held by it: no cycle.
  struct Join {
    std::vector<Future<T>> inputs;
    std::atomic<std::size_t> left;
    Promise<R> out;
  };
  auto join = std::make_shared<Join>();
  join->left = fs.size();
  join->inputs.resize(fs.size());
  auto done = [join, finish] { finish(join->inputs, join->out); };
  if (fs.empty()) { done(); return join->out.future(); }
  for (std::size_t i = 0; i < fs.size(); ++i) {
    std::weak_ptr<State<T>> weak = fs[i].state();
    fs[i].state()->on_ready([join, done, weak, i] {
      join->inputs[i] = Future<T>(weak.lock());   // the completing thread holds it (StateBase::on_ready); else invalid
      if (join->left.fetch_sub(1, std::memory_order_acq_rel) == 1) done();
    });
  }
  return join->out.future();
}

}  // namespace detail

// The first error by index wins.
template <class T>
Future<std::conditional_t<std::is_void_v<T>, void, std::vector<T>>> when_all(std::vector<Future<T>> fs) {
  using R = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;
  return detail::join_all<R>(std::move(fs), [](std::vector<Future<T>>& inputs, Promise<R>& out) {
    for (auto& f : inputs) {
      if (!f.valid()) { out.set_error(Error{ErrorCode::Internal, "when_all: an input was freed as it completed"}); return; }
      if (f.state()->has_error()) { out.set_error(f.state()->error()); return; }
    }
    if constexpr (std::is_void_v<T>) {
      out.set_value();
    } else {
      std::vector<T> values;
      values.reserve(inputs.size());
      for (auto& f : inputs) values.push_back(std::move(f.state()->value()));
      out.set_value(std::move(values));
    }
  });
}

// Each input's own value or error.
template <class T>
Future<std::vector<Result<T>>> when_all_results(std::vector<Future<T>> fs) {
  return detail::join_all<std::vector<Result<T>>>(std::move(fs), [](std::vector<Future<T>>& inputs, Promise<std::vector<Result<T>>>& out) {
    std::vector<Result<T>> results;
    results.reserve(inputs.size());
    for (auto& f : inputs) {
      if (!f.valid()) results.emplace_back(Error{ErrorCode::Internal, "when_all_results: the input was freed as it completed"});
      else if (f.state()->has_error()) results.emplace_back(f.state()->error());
      else if constexpr (std::is_void_v<T>) results.emplace_back();
      else results.emplace_back(std::move(f.state()->value()));
    }
    out.set_value(std::move(results));
  });
}

}  // namespace troupe
