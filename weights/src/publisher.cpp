// WeightPublisher: versions, transfer holds with leases, and the process-local registry that
// gives same-process subscribers the no-copy path.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <mutex>
#include <stdexcept>

#include "troupe/proc_file.hpp"
#include "troupe/weight_set.hpp"
#include "buffer_pool.hpp"
#include "set_builder.hpp"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kLivenessEvery = std::chrono::milliseconds(200);   // /proc reads per sweep, bounded

struct LocalRegistry {
  std::mutex mu;
  std::map<std::uint64_t, std::weak_ptr<WeightPublisher>> by_key;
  std::uint64_t next = 1;
};
LocalRegistry& registry() {
  static LocalRegistry* r = new LocalRegistry;   // never destroyed: publishers may outlive statics
  return *r;
}

constexpr const char* kUnknown = "?";   // the process could not be looked at (not: it is gone)

// The start time of process `pid` (field 22 of /proc/<pid>/stat), "" when it is gone, or kUnknown
// when /proc cannot tell (out of descriptors, ...).
std::string process_start(std::uint32_t pid) {
  std::string stat;
  if (const int err = read_proc_file("/proc/" + std::to_string(pid) + "/stat", stat); err != 0) {
    return err == ENOENT || err == ESRCH ? "" : kUnknown;   // gone (or ending while read), or /proc cannot tell
  }
  auto paren = stat.rfind(')');   // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return "";
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  for (int i = 3; i <= 22 && fields >> f; ++i) {
    if (i == 3 && f == "Z") return "";   // a zombie maps nothing any more
    if (i == 22) return f;
  }
  return "";
}

}  // namespace

const TensorView* WeightSet::find(const std::string& name) const {
  for (const auto& t : tensors_) if (t.name == name) return &t.tensor;
  return nullptr;
}

struct WeightPublisher::State {
  struct Hold {
    WeightSetPtr set;
    std::uint64_t region = 0;
    Clock::time_point expires;
    std::uint32_t pid = 0;          // a mapping holder: held while this process lives
    std::string started;            // its start time (a reused pid is another process)
  };
  std::shared_ptr<detail::weights::BufferPool> pool;
  mutable std::mutex mu;
  WeightSetPtr latest;
  std::map<std::uint64_t, std::weak_ptr<const WeightSet>> versions;   // every version not yet freed
  std::map<std::pair<std::uint64_t, std::string>, Hold> holds;
  std::uint64_t transfers = 0;
  Clock::time_point next_liveness_check;   // holders' processes are looked up at most this often

  void sweep_locked() {
    auto now = Clock::now();
    bool check_pids = now >= next_liveness_check;
    if (check_pids) next_liveness_check = now + kLivenessEvery;
    for (auto it = holds.begin(); it != holds.end();) {
      const Hold& h = it->second;
      bool live = h.expires > now;
      if (h.pid != 0 && check_pids) {
        auto started = process_start(h.pid);
        live = started == kUnknown || started == h.started;
      } else if (h.pid != 0) {
        live = true;
      }
      if (live) { ++it; continue; }
      it = holds.erase(it);   // its region ends by the data plane's own lease (same length)
    }
    for (auto it = versions.begin(); it != versions.end();) {
      it = it->second.expired() ? versions.erase(it) : std::next(it);
    }
  }
};

WeightPublisher::WeightPublisher(PublisherOptions opts) : opts_(opts), state_(std::make_shared<State>()) {
  detail::weights::SetBuilder::check_device(opts_.device, "WeightPublisher");
  state_->pool = std::make_shared<detail::weights::BufferPool>(opts_.idle_buffers);
  std::lock_guard lock(registry().mu);
  key_ = registry().next++;
}

WeightPublisher::~WeightPublisher() {
  std::lock_guard lock(registry().mu);
  registry().by_key.erase(key_);
}

std::shared_ptr<WeightPublisher> WeightPublisher::find_local(std::uint64_t key) {
  std::lock_guard lock(registry().mu);
  auto it = registry().by_key.find(key);
  return it == registry().by_key.end() ? nullptr : it->second.lock();
}

void PublisherOptions::msgpack_unpack(const msgpack::object& o) {
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 5) throw DecodeError("PublisherOptions: expected 5 fields");
  const msgpack::object* f = o.via.array.ptr;
  std::uint8_t c = 0;
  std::int64_t lease_ms = 0;
  std::uint64_t idle = 0;
  detail::convert_checked(f[0], c);
  detail::convert_checked(f[1], lease_ms);
  detail::convert_checked(f[2], idle);
  detail::convert_checked(f[3], device);
  detail::convert_checked(f[4], relay_maps);
  if (c > std::uint8_t(WireCompression::Int8Row)) throw DecodeError("PublisherOptions: no compression " + std::to_string(c));
  if (lease_ms < 0) throw DecodeError("PublisherOptions: a negative hold lease");
  compression = static_cast<WireCompression>(c);
  hold_lease = std::chrono::milliseconds(lease_ms);
  idle_buffers = std::size_t(idle);
}

std::shared_ptr<WeightPublisher> WeightPublisher::create(PublisherOptions opts) {
  auto p = std::make_shared<WeightPublisher>(opts);
  std::lock_guard lock(registry().mu);
  registry().by_key[p->key()] = p;
  return p;
}

WeightSetPtr WeightPublisher::publish(std::uint64_t version, const std::vector<NamedTensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.tensor.nbytes() > 0 && t.tensor.data == nullptr) throw std::invalid_argument("weights: '" + t.name + "' has no data");
    if (!t.tensor.is_contiguous()) throw std::invalid_argument("weights: '" + t.name + "' is not contiguous");
  }
  return publish_in_place(version, detail::weights::SetBuilder::entries_of(tensors), [&](std::size_t i, void* dst) {
    std::memcpy(dst, tensors[i].tensor.data, tensors[i].tensor.nbytes());
  });
}

WeightSetPtr WeightPublisher::publish_in_place(std::uint64_t version, const std::vector<WeightEntry>& entries,
                                               const std::function<void(std::size_t, void*)>& write) {
  if (version == 0 || version == kLatestVersion) throw std::invalid_argument("weights: version must be in [1, 2^64-2]");
  if (auto l = latest(); l && version <= l->version()) {
    throw std::invalid_argument("weights: version " + std::to_string(version) + " is not above the latest (" +
                                std::to_string(l->version()) + ")");
  }
  for (const auto& e : entries) {
    if (!dtype_valid(e.dtype)) throw std::invalid_argument("weights: bad dtype for '" + e.name + "'");
  }
  auto set = detail::weights::SetBuilder::build(version, entries, opts_.compression, *state_->pool, write,
                                                    opts_.device);
  adopt(set);
  return set;
}

void WeightPublisher::adopt(WeightSetPtr set) {
  if (set->device() >= 0) throw std::invalid_argument("weights: a set in device memory cannot be re-published");
  std::lock_guard lock(state_->mu);
  if (state_->latest && set->version() <= state_->latest->version()) {
    throw std::invalid_argument("weights: version " + std::to_string(set->version()) + " is not above the latest");
  }
  state_->versions[set->version()] = set;
  state_->latest = std::move(set);   // the previous latest lives on only in its holders (WS-2)
  state_->sweep_locked();
}

WeightSetPtr WeightPublisher::latest() const {
  std::lock_guard lock(state_->mu);
  return state_->latest;
}

WeightSetPtr WeightPublisher::get(std::uint64_t version) const {
  std::lock_guard lock(state_->mu);
  if (version == kLatestVersion) return state_->latest;
  auto it = state_->versions.find(version);
  return it == state_->versions.end() ? nullptr : it->second.lock();
}

void WeightPublisher::clear() {
  WeightSetPtr dropped;   // freed outside the lock
  std::lock_guard lock(state_->mu);
  dropped = std::move(state_->latest);
}

std::uint64_t WeightPublisher::hold(WeightSetPtr set, const std::string& subscriber, std::uint64_t region,
                                    std::uint32_t holder_pid, bool* lifetime) {
  std::string started = holder_pid != 0 ? process_start(holder_pid) : std::string();
  if (started.empty() || started == kUnknown) holder_pid = 0;   // not a process seen here: a lease then
  if (lifetime != nullptr) *lifetime = holder_pid != 0;
  WeightSetPtr replaced_set;
  std::lock_guard lock(state_->mu);
  state_->sweep_locked();
  ++state_->transfers;
  auto& h = state_->holds[{set->version(), subscriber}];
  std::uint64_t replaced = h.region;   // a repeated pull replaces the old hold
  replaced_set = std::move(h.set);
  h = {std::move(set), region, Clock::now() + opts_.hold_lease, holder_pid, std::move(started)};
  return replaced;
}

std::uint64_t WeightPublisher::release(std::uint64_t version, const std::string& subscriber) {
  WeightSetPtr dropped;
  std::lock_guard lock(state_->mu);
  auto it = state_->holds.find({version, subscriber});
  if (it == state_->holds.end()) return 0;
  dropped = std::move(it->second.set);
  std::uint64_t region = it->second.region;
  state_->holds.erase(it);
  return region;
}

void WeightPublisher::sweep() {
  std::lock_guard lock(state_->mu);
  state_->sweep_locked();
}

PublisherStats WeightPublisher::stats() const {
  std::lock_guard lock(state_->mu);
  state_->sweep_locked();
  PublisherStats s;
  s.latest = state_->latest ? state_->latest->version() : 0;
  s.live_versions = state_->versions.size();
  s.holds = state_->holds.size();
  s.buffers_allocated = state_->pool->allocated();
  s.transfers = state_->transfers;
  return s;
}

}  // namespace troupe
