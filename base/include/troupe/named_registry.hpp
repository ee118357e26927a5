// NamedRegistry<T>: entries by name (actor types, training objectives, reward verifiers), made at
// static initialisation by the registration macros, so that every process of a binary has them
// (a worker process never runs main). Thread-safe; an entry's address never changes.
#pragma once

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

template <class T>
class NamedRegistry {
 public:
  // `what` names an entry in errors: "no objective registered as 'x'".
  explicit NamedRegistry(std::string what) : what_(std::move(what)) {}
  NamedRegistry(const NamedRegistry&) = delete;
  NamedRegistry& operator=(const NamedRegistry&) = delete;

  // The entry called `name`, default-made on first use.
  T& slot(const std::string& name) {
    std::lock_guard lk(mu_);
    return entries_[name];
  }
  // Adds `name`, or replaces its entry.
  void put(const std::string& name, T value) { slot(name) = std::move(value); }
  // Null when there is no such entry.
  const T* find(std::string_view name) const {
    std::lock_guard lk(mu_);
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
  }
  // Every entry's name, in order.
  std::vector<std::string> names() const {
    std::lock_guard lk(mu_);
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [name, entry] : entries_) out.push_back(name);
    return out;
  }
  // Throws std::invalid_argument naming the entry and listing the known ones when there is none:
  // "no objective registered as 'x' (known: dpo, grpo)".
  const T& at(std::string_view name) const {
    if (const T* e = find(name)) return *e;
    std::string known;
    for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("no " + what_ + " registered as '" + std::string(name) + "' (known: " +
                                (known.empty() ? "none" : known) + ")");
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, T, std::less<>> entries_;
  std::string what_;
};

}  // namespace troupe
