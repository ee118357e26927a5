// when_all: completes once every input has; the first error by index wins.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

namespace troupe {

template <class T>
Future<std::conditional_t<std::is_void_v<T>, void, std::vector<T>>> when_all(std::vector<Future<T>> fs) {
  using R = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;
  struct Join {
    std::vector<Future<T>> inputs;
    std::atomic<std::size_t> left;
    Promise<R> out;
  };
  auto join = std::make_shared<Join>();
  join->left = fs.size();
  join->inputs = std::move(fs);
  auto finish = [join] {
    for (auto& f : join->inputs) {
      if (f.state()->has_error()) { join->out.set_error(f.state()->error()); return; }
    }
    if constexpr (std::is_void_v<T>) {
      join->out.set_value();
    } else {
      std::vector<T> values;
      values.reserve(join->inputs.size());
      for (auto& f : join->inputs) values.push_back(std::move(f.state()->value()));
      join->out.set_value(std::move(values));
    }
  };
  if (join->inputs.empty()) { finish(); return join->out.future(); }
  for (auto& f : join->inputs) {
    f.state()->on_ready([join, finish] {
      if (join->left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
    });
  }
  return join->out.future();
}

// when_all_results: completes once every input has, with each input's own value or error.
template <class T>
Future<std::vector<Result<T>>> when_all_results(std::vector<Future<T>> fs) {
  struct Join {
    std::vector<Future<T>> inputs;
    std::atomic<std::size_t> left;
    Promise<std::vector<Result<T>>> out;
  };
  auto join = std::make_shared<Join>();
  join->left = fs.size();
  join->inputs = std::move(fs);
  auto finish = [join] {
    std::vector<Result<T>> results;
    results.reserve(join->inputs.size());
    for (auto& f : join->inputs) {
      if (f.state()->has_error()) results.emplace_back(f.state()->error());
      else if constexpr (std::is_void_v<T>) results.emplace_back();
      else results.emplace_back(std::move(f.state()->value()));
    }
    join->out.set_value(std::move(results));
  };
  if (join->inputs.empty()) { finish(); return join->out.future(); }
  for (auto& f : join->inputs) {
    f.state()->on_ready([join, finish] {
      if (join->left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
    });
  }
  return join->out.future();
}

}  // namespace troupe
