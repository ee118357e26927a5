// The weight store in one process: publish/pull, the no-copy path, atomic swap under readers,
// version freeing (WS-2), the copy path's checksum (WS-1), wire compression bounds, the device path
// and how an NCCL group's members gather.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "troupe/troupe.hpp"
#include "troupe/weights.hpp"
#include "gpu_sync.hpp"
#include "nccl_group.hpp"
#include "set_builder.hpp"
#include "support/skip.hpp"

using namespace std::chrono_literals;
using troupe::NamedTensor;
using troupe::TensorView;
using troupe::ErrorException;
using troupe::WeightCode;

namespace {

TensorView filled(std::vector<std::int64_t> shape, float base) {
  auto t = TensorView::empty(troupe::DType::F32, std::move(shape));
  auto* p = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = base + std::sin(float(i)) * (1.0f + float(i % 7));
  return t;
}

std::vector<NamedTensor> model(float base) {
  return {{"embed", filled({64, 300}, base)}, {"bias", filled({17}, base)}, {"w", filled({3, 5000}, base)}};
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("weight checksum is chunked: any bucket split gives the same value, any flipped byte changes it") {
  std::vector<unsigned char> buf((3u << 20) + 123);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = (unsigned char)(i * 131 + (i >> 9));
  auto whole = troupe::weight_checksum(buf.data(), buf.size());
  auto s = troupe::checksum_init(buf.size());
  s = troupe::checksum_update(s, buf.data(), 2u << 20, 0);
  s = troupe::checksum_update(s, buf.data() + (2u << 20), buf.size() - (2u << 20), 2u << 20);
  CHECK(s == whole);
  buf[(2u << 20) + 5] ^= 1;
  CHECK(troupe::weight_checksum(buf.data(), buf.size()) != whole);
}

TEST_CASE("weight publisher: publish copies once, versions increase, a version is freed when nobody holds it (WS-2)") {
  auto pub = troupe::WeightPublisher::create();
  auto src = model(1.0f);
  auto v1 = pub->publish(1, src);
  CHECK(v1->version() == 1);
  REQUIRE(v1->find("w") != nullptr);
  CHECK(same_bytes(*v1->find("w"), src[2].tensor));
  CHECK(v1->find("w")->data != src[2].tensor.data);     // its own shared-memory copy
  CHECK_THROWS_AS(pub->publish(1, src), std::invalid_argument);
  CHECK_THROWS_AS(pub->publish(2, {{"a", filled({2}, 0)}, {"a", filled({2}, 0)}}), std::invalid_argument);

  std::weak_ptr<const troupe::WeightSet> w1 = v1;
  auto v2 = pub->publish(2, model(2.0f));
  CHECK(pub->get(1) == v1);                              // still held here
  CHECK(pub->stats().live_versions == 2);
  v1.reset();
  CHECK(w1.expired());                                   // freed once the last holder let go
  CHECK(pub->get(1) == nullptr);
  // Its buffer is reused: a third version of the same shapes allocates nothing new.
  auto allocated = pub->stats().buffers_allocated;
  v2.reset();
  auto v3 = pub->publish(3, model(3.0f));
  auto v4 = pub->publish(4, model(4.0f));
  CHECK(pub->stats().buffers_allocated == allocated);
  CHECK(pub->stats().live_versions == 2);                // v3 held here, v4 latest
}

TEST_CASE("weight store in-process: a subscriber takes the publisher's version with no copy") {
  auto rt = troupe::Runtime::create().value();
  auto store = rt.spawn<troupe::WeightStore>(troupe::Options{});
  auto src = model(1.0f);
  CHECK(store.call(&troupe::WeightStore::publish, std::uint64_t(7), src).get() != 0);
  troupe::WeightSubscriber sub(store);
  auto set = sub.update();
  REQUIRE(set);
  CHECK(set->version() == 7);
  CHECK(same_bytes(*set->find("embed"), src[0].tensor));
  auto again = sub.update();                             // up to date: the same object
  CHECK(again == set);
  CHECK(store.call(&troupe::WeightStore::stats).get().holds == 0);
  try {
    (void)sub.pull(99);
    FAIL("pulled a version never published");
  } catch (const ErrorException& e) {
    CHECK(e.code() == WeightCode::NotFound);
  }
}

TEST_CASE("weight subscriber: the swap is atomic for concurrent readers, who keep their version alive") {
  auto rt = troupe::Runtime::create().value();
  auto store = rt.spawn<troupe::WeightStore>(troupe::Options{});
  troupe::WeightSubscriber sub(store);
  std::atomic<bool> stop{false};
  std::atomic<long> reads{0}, torn{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!stop) {
        auto s = sub.current();
        if (!s) continue;
        // Every tensor of one set carries its version's value: never a mix.
        float want = float(s->version());
        for (const auto& t : s->tensors()) if (t.tensor.data_as<float>()[0] != want) ++torn;
        ++reads;
      }
    });
  }
  for (std::uint64_t v = 1; v <= 200; ++v) {
    std::vector<NamedTensor> ts;
    for (int i = 0; i < 3; ++i) {
      auto t = TensorView::empty(troupe::DType::F32, {256});
      for (int j = 0; j < 256; ++j) t.data_as<float>()[j] = float(v);
      ts.push_back({"t" + std::to_string(i), t});
    }
    store.call(&troupe::WeightStore::publish, v, ts).get();
    CHECK(sub.update()->version() == v);
  }
  stop = true;
  for (auto& t : readers) t.join();
  CHECK(torn == 0);
  CHECK(reads > 0);
  CHECK(store.call(&troupe::WeightStore::stats).get().live_versions <= 2);
}

// A manifest's entries come from a peer: a shape whose bytes do not fit in 63 bits, or a set whose
// sum does not, is refused (an entry of [2^62, 4] f32 wrapped to 0 bytes and passed the checks).
TEST_CASE("a weight set's layout refuses entries too large to address") {
  namespace w = troupe::detail::weights;
  std::size_t total = 0;
  const auto f32 = static_cast<std::uint8_t>(troupe::DType::F32);
  CHECK_THROWS_AS(w::SetBuilder::offsets({{"a", f32, {std::int64_t(1) << 62, 4}}}, &total), std::invalid_argument);
  const std::vector<troupe::WeightEntry> halves = {{"a", f32, {std::int64_t(1) << 60}}, {"b", f32, {std::int64_t(1) << 60}}};
  CHECK_THROWS_AS(w::SetBuilder::offsets(halves, &total), std::invalid_argument);
  const auto offs = w::SetBuilder::offsets({{"a", f32, {3}}, {"b", f32, {2, 2}}}, &total);
  CHECK(offs == std::vector<std::size_t>{0, w::kAlign});
  CHECK(total == 2 * w::kAlign);
}

TEST_CASE("weight copy path: bytes and checksum survive, a corrupted transfer is refused (WS-1)") {
  auto rt = troupe::Runtime::create().value();
  auto store = rt.spawn<troupe::WeightStore>(troupe::Options{});
  auto src = model(1.0f);
  store.call(&troupe::WeightStore::publish, std::uint64_t(1), src).get();
  troupe::SubscriberOptions opts;
  opts.allow_local = false;
  opts.map_shared = false;
  opts.bucket_bytes = 1 << 20;
  troupe::WeightSubscriber sub(store, opts);
  auto set = sub.update();
  REQUIRE(set);
  for (const auto& t : src) CHECK(same_bytes(*set->find(t.name), t.tensor));
  CHECK(store.call(&troupe::WeightStore::stats).get().holds == 0);   // released after the pull

  // Flip one byte of the published image after its checksum was taken.
  store.call(&troupe::WeightStore::publish, std::uint64_t(2), model(2.0f)).get();
  troupe::WeightSubscriber local(store);
  auto published = local.pull(2);
  static_cast<char*>(published->wire().data)[12345] ^= 0x40;
  try {
    (void)sub.update(2);
    FAIL("a corrupted version was accepted");
  } catch (const ErrorException& e) {
    CHECK(e.code() == WeightCode::Checksum);
  }
  CHECK(sub.current()->version() == 1);                  // nothing was swapped in
}

TEST_CASE("weight mapped path: the version is read in place, held while mapped, and verified on request") {
  auto rt = troupe::Runtime::create().value();
  auto store = rt.spawn<troupe::WeightStore>(troupe::Options{});
  auto src = model(3.0f);
  auto sum = store.call(&troupe::WeightStore::publish, std::uint64_t(1), src).get();
  troupe::SubscriberOptions opts;
  opts.allow_local = false;   // as if from another process on this host
  troupe::WeightSubscriber sub(store, opts);
  auto set = sub.update();
  REQUIRE(set);
  troupe::WeightSubscriber local(store);
  auto published = local.pull(1);
  // The publisher's own memory (mapped again at another address): a byte changed there shows.
  auto* theirs = static_cast<unsigned char*>(published->wire().data);
  const auto* mine = static_cast<const unsigned char*>(set->wire().data);
  theirs[4096] ^= 0xFF;
  CHECK(mine[4096] == theirs[4096]);
  theirs[4096] ^= 0xFF;
  CHECK(set->checksum() == sum);
  for (const auto& t : src) CHECK(same_bytes(*set->find(t.name), t.tensor));
  CHECK(store.call(&troupe::WeightStore::stats).get().holds == 1);   // held while mapped (WS-2)
  set.reset();
  sub.reset();   // the last view goes: the hold is released
  int holds = 1;
  for (int i = 0; i < 200 && holds != 0; ++i) {
    std::this_thread::sleep_for(10ms);
    holds = int(store.call(&troupe::WeightStore::stats).get().holds);
  }
  CHECK(holds == 0);

  // verify_mapped hashes the mapping: a byte changed after the checksum was taken is caught.
  store.call(&troupe::WeightStore::publish, std::uint64_t(2), model(4.0f)).get();
  static_cast<char*>(local.pull(2)->wire().data)[999] ^= 0x01;
  opts.verify_mapped = true;
  troupe::WeightSubscriber checking(store, opts);
  CHECK_THROWS_AS((void)checking.update(2), ErrorException);
  CHECK(checking.current() == nullptr);
}

TEST_CASE("weight wire compression: bf16 and int8-per-row stay within their stated bounds") {
  for (auto c : {troupe::WireCompression::BF16, troupe::WireCompression::Int8Row}) {
    auto rt = troupe::Runtime::create().value();
    troupe::PublisherOptions po;
    po.compression = c;
    auto store = rt.spawn<troupe::WeightStore>(troupe::Options{}, po);
    auto src = model(0.5f);
    store.call(&troupe::WeightStore::publish, std::uint64_t(1), src).get();
    troupe::SubscriberOptions opts;
    opts.allow_local = false;
    troupe::WeightSubscriber sub(store, opts);
    auto set = sub.update();
    CHECK(set->wire_bytes() < set->bytes());
    for (const auto& t : src) {
      const auto* got = set->find(t.name);
      REQUIRE(got != nullptr);
      std::int64_t rows = t.tensor.shape.size() >= 2 ? t.tensor.shape[0] : 1, cols = t.tensor.numel() / rows;
      const float* x = t.tensor.data_as<float>();
      const float* y = got->data_as<float>();
      for (std::int64_t r = 0; r < rows; ++r) {
        float amax = 0;
        for (std::int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::fabs(x[r * cols + j]));
        for (std::int64_t j = 0; j < cols; ++j) {
          float e = std::fabs(x[r * cols + j] - y[r * cols + j]);
          float bound = c == troupe::WireCompression::BF16 ? std::ldexp(std::fabs(x[r * cols + j]), -8)
                                                           : 1.0001f * amax / 254.0f;
          if (e > bound) { FAIL_CHECK(t.name << "[" << r << "," << j << "] error " << e << " > " << bound); return; }
        }
      }
    }
  }
}

TEST_CASE("weight device path: a device the build or machine lacks is refused") {
  namespace gpu = troupe::detail::weights::gpu;
  std::string why;
  const int devices = gpu::device_count(&why);
  troupe::PublisherOptions missing;
  missing.device = devices;   // one past the last device there is
  CHECK_THROWS_WITH_AS(troupe::WeightPublisher{missing}, doctest::Contains("device"), std::invalid_argument);
  auto rt = troupe::Runtime::create().value();
  auto host_store = rt.spawn<troupe::WeightStore>(troupe::Options{});
  troupe::SubscriberOptions want;
  want.device = devices;
  CHECK_THROWS_WITH_AS(troupe::WeightSubscriber(host_store, want), doctest::Contains("device"), std::invalid_argument);
}

TEST_CASE("weight device path: on a GPU, pulled sets land on it with the published bytes") {
  namespace gpu = troupe::detail::weights::gpu;
  std::string why;
  if (gpu::device_count(&why) == 0) TROUPE_SKIP("no CUDA device here (" + why + "); checked on a GPU machine");
  auto rt = troupe::Runtime::create().value();
  // A publisher mirrored on device 0; subscribers in this process take the mirror without a copy,
  // or (allow_local = false: CUDA IPC cannot open a handle in its own process) pull to host and
  // upload. Either way the bytes on the device are the published ones.
  troupe::PublisherOptions mirrored;
  mirrored.device = 0;
  auto store = rt.spawn<troupe::WeightStore>(troupe::Options{}, mirrored);
  auto src = model(2.0f);
  store.call(&troupe::WeightStore::publish, std::uint64_t(1), src).get();
  for (bool local : {true, false}) {
    troupe::SubscriberOptions opts;
    opts.device = 0;
    opts.allow_local = local;
    troupe::WeightSubscriber sub(store, opts);
    auto set = sub.update();
    REQUIRE(set);
    CHECK(set->device() == 0);
    CHECK(set->wire_bytes() == 0);
    for (const auto& t : src) {
      const auto* d = set->find(t.name);
      REQUIRE(d != nullptr);
      std::vector<char> back(d->nbytes());
      REQUIRE(gpu::copy_to_host(d->data, back.size(), back.data(), 0, &why));
      CHECK(std::memcmp(back.data(), t.tensor.data, back.size()) == 0);
    }
  }
}

TEST_CASE("weight NCCL groups gather: formed once every member is asking together, one that stopped asking has gone") {
  using troupe::detail::weights::Forming;
  const auto t0 = Forming::Clock::now();
  Forming three(3, 2s);   // the store and two members
  CHECK_FALSE(three.arrive("b", t0));
  CHECK_FALSE(three.arrive("b", t0 + 1ms));   // asking again is one member still
  CHECK(three.arrive("a", t0 + 2ms));
  CHECK(three.members() == std::vector<std::string>{"a", "b"});   // rank order: 1 = "a", 2 = "b"

  Forming late(3, 2s);
  CHECK_FALSE(late.arrive("a", t0));
  CHECK_FALSE(late.arrive("b", t0 + 3s));   // "a" stopped asking 3 s ago: gone, not counted
  CHECK(late.members() == std::vector<std::string>{"b"});
  CHECK(late.arrive("c", t0 + 4s));
  CHECK(late.members() == std::vector<std::string>{"b", "c"});

  Forming pair(2, 2s);   // one member forms a group with the store at once
  CHECK(pair.arrive("x", t0));

  Forming left(3, 2s);   // one that said it gave up does not count
  CHECK_FALSE(left.arrive("a", t0));
  left.depart("a");
  CHECK_FALSE(left.arrive("b", t0 + 1ms));
  CHECK(left.members() == std::vector<std::string>{"b"});
}
