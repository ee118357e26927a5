// The tensor data plane: descriptors, inline tensors, and real two-process pulls over UCX.
// Multi-process cases re-run this binary as a helper (fork + exec at once: UCX and CAF threads
// in this process make anything else after fork unsafe); every wait is bounded and every helper
// is killed and reaped on all paths (DP-1 and FT-1 in spirit: no hang, no leftover process).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "troupe/transport/data_plane.hpp"
#include "support/helper_main.hpp"
#include "support/pipe_io.hpp"

extern char** environ;

namespace {

namespace tp = troupe::transport;
using troupe::DType;
using troupe::TensorView;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using test_support::read_exact;
using test_support::write_exact;


std::uint64_t mix(std::uint64_t x) {   // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void fill(void* p, std::size_t n, std::uint64_t seed) {
  auto* b = static_cast<unsigned char*>(p);
  std::size_t words = n / 8;
  for (std::size_t i = 0; i < words; ++i) { std::uint64_t v = mix(seed + i); std::memcpy(b + 8 * i, &v, 8); }
  for (std::size_t i = words * 8; i < n; ++i) b[i] = static_cast<unsigned char>(mix(seed + i));
}

// Index of the first byte that differs from fill(seed), or n.
std::size_t first_mismatch(const void* p, std::size_t n, std::uint64_t seed) {
  auto* b = static_cast<const unsigned char*>(p);
  std::size_t words = n / 8;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t v = mix(seed + i);
    if (std::memcmp(b + 8 * i, &v, 8) != 0) return 8 * i;
  }
  for (std::size_t i = words * 8; i < n; ++i) if (b[i] != static_cast<unsigned char>(mix(seed + i))) return i;
  return n;
}

// This binary re-run in the helper role: it exposes one filled tensor, sends the descriptor
// through a pipe and waits for the parent to close the other pipe. Killed and reaped on scope exit.
class Helper {
 public:
  Helper(const std::string& mode, std::size_t bytes, std::uint64_t seed, const std::string& ucx_tls = "") {
    int up[2], down[2];
    REQUIRE(::pipe(up) == 0);
    REQUIRE(::pipe(down) == 0);
    std::string spec = mode + ":" + std::to_string(bytes) + ":" + std::to_string(seed) + ":" +
                       std::to_string(up[1]) + ":" + std::to_string(down[0]);
    std::vector<std::string> env;
    if (!ucx_tls.empty()) env.push_back("UCX_TLS=" + ucx_tls);
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "UCX_TLS=", 8) != 0 || ucx_tls.empty()) env.emplace_back(*e);
    }
    std::vector<char*> envp, argv;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", flag = "--test-helper", name = "transport";
    argv = {exe.data(), flag.data(), name.data(), spec.data(), nullptr};
    int devnull = ::open("/dev/null", O_WRONLY);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {   // async-signal-safe calls only until exec
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(devnull, 1);
      ::close(up[0]);
      ::close(down[1]);
      ::execve("/proc/self/exe", argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(devnull);
    ::close(up[1]);
    ::close(down[0]);
    from_child_ = up[0];
    to_child_ = down[1];
  }
  ~Helper() { kill_now(); }

  // The descriptor bytes the helper sent, or empty if none came within `timeout`.
  std::vector<char> descriptor(milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    std::uint32_t len = 0;
    if (!read_exact(from_child_, &len, 4, deadline) || len > (1u << 20)) return {};
    std::vector<char> b(len);
    if (!read_exact(from_child_, b.data(), len, deadline)) return {};
    return b;
  }

  // Lets the helper exit on its own; true if it exited with status 0 within 10 s.
  bool finish() {
    close_fds();
    for (auto deadline = Clock::now() + std::chrono::seconds(10); Clock::now() < deadline;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  }

  void kill_now() {
    close_fds();
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  void close_fds() {
    if (from_child_ >= 0) ::close(from_child_);
    if (to_child_ >= 0) ::close(to_child_);
    from_child_ = to_child_ = -1;
  }
  pid_t pid_ = -1;
  int from_child_ = -1, to_child_ = -1;
};

// The helper role. Modes: "alloc" (DataPlane::allocate buffer), "plain" (ordinary memory,
// registered in place), "strided" (a transposed view: exposed as a copy).
int run_helper(const std::string& spec) {
  char mode[16] = {};
  unsigned long long bytes = 0, seed = 0;
  int wfd = -1, rfd = -1;
  if (std::sscanf(spec.c_str(), "%15[^:]:%llu:%llu:%d:%d", mode, &bytes, &seed, &wfd, &rfd) != 5) return 2;
  tp::DataPlane plane;
  auto n = std::int64_t(bytes);
  TensorView t = std::strcmp(mode, "alloc") == 0 ? plane.allocate(DType::U8, {n})
                                                 : TensorView::empty(DType::U8, {n});
  fill(t.data, bytes, seed);
  if (std::strcmp(mode, "strided") == 0) {   // same bytes seen as [2, n/2] and transposed
    t.shape = {n / 2, 2};
    t.strides = {1, n / 2};
  }
  auto d = tp::encode(plane.expose(t));
  std::uint32_t len = std::uint32_t(d.size());
  try {
    write_exact(wfd, &len, 4);
    write_exact(wfd, d.data(), d.size());
  } catch (const std::runtime_error&) {
    return 1;   // the test went away
  }
  char c;
  pollfd pf{rfd, POLLIN, 0};
  ::poll(&pf, 1, 60000);   // until the parent closes its end (or a minute)
  (void)::read(rfd, &c, 1);
  return 0;
}

tp::TensorDescriptor sample_remote() {
  tp::TensorDescriptor d;
  d.dtype = DType::BF16;
  d.shape = {4, 1 << 16};
  d.nbytes = 2u * 4 * (1 << 16);
  d.region = 7;
  d.owner_pid = 1234;
  d.worker_address = std::vector<char>(215, 'a');
  d.remote_address = 0x7f0000001000;
  d.rkey = std::vector<char>(12, 'k');
  return d;
}

}  // namespace

TROUPE_TEST_HELPER("transport", run_helper);

TEST_CASE("transport: encode_inline writes inline_descriptor's encoding, and a view decodes it in place") {
  auto t = TensorView::empty(DType::F32, {4, 6});
  for (int i = 0; i < 24; ++i) t.data_as<float>()[i] = float(i) * 0.5f;
  auto strided = t;   // the transpose: gathered row-major
  strided.shape = {6, 4};
  strided.strides = {1, 6};
  for (const auto& v : {t, strided, TensorView::empty(DType::I64, {0, 3})}) {
    CAPTURE(v.shape.size());
    const auto wire = tp::encode_inline(v);
    CHECK(wire == tp::encode(tp::inline_descriptor(v)));
    const auto view = tp::decode_descriptor_view(wire.data(), wire.size());
    CHECK(view.descriptor.is_inline);
    CHECK(view.descriptor.shape == v.shape);
    CHECK(view.descriptor.inline_bytes.empty());   // left where they are
    const auto full = tp::decode_descriptor(wire);
    REQUIRE(full.inline_bytes.size() == v.nbytes());
    if (v.nbytes() > 0) {
      CHECK(view.inline_data >= wire.data());
      CHECK(view.inline_data + v.nbytes() == wire.data() + wire.size());   // the payload ends the encoding
      CHECK(std::memcmp(view.inline_data, full.inline_bytes.data(), v.nbytes()) == 0);
    }
  }
  const auto remote = tp::encode(sample_remote());
  CHECK(tp::decode_descriptor_view(remote.data(), remote.size()).inline_data == nullptr);
  // Past what a lane carries, or without data: refused, as encode refuses.
  auto big = TensorView::empty(DType::U8, {std::int64_t(tp::kLaneInlineMaxBytes) + 1});
  CHECK_THROWS_AS(tp::encode_inline(big), troupe::ErrorException);
  auto no_data = t;
  no_data.data = nullptr;
  CHECK_THROWS_AS(tp::encode_inline(no_data), troupe::ErrorException);
  // Malformed bytes: refused by the view as by decode_descriptor (the cases of the test below).
  auto cut = tp::encode_inline(t);
  cut.pop_back();
  CHECK_THROWS_AS(tp::decode_descriptor_view(cut.data(), cut.size()), troupe::ErrorException);
}

TEST_CASE("transport: descriptors round-trip through their wire format") {
  auto d = sample_remote();
  auto back = tp::decode_descriptor(tp::encode(d));
  CHECK(back.dtype == d.dtype);
  CHECK(back.shape == d.shape);
  CHECK(back.nbytes == d.nbytes);
  CHECK_FALSE(back.is_inline);
  CHECK(back.region == 7);
  CHECK(back.owner_pid == 1234);
  CHECK(back.worker_address == d.worker_address);
  CHECK(back.remote_address == d.remote_address);
  CHECK(back.rkey == d.rkey);

  tp::TensorDescriptor small;
  small.dtype = DType::I32;
  small.shape = {3};
  small.nbytes = 12;
  small.is_inline = true;
  small.inline_bytes = std::vector<char>(12, 'x');
  auto sb = tp::decode_descriptor(tp::encode(small));
  CHECK(sb.is_inline);
  CHECK(sb.inline_bytes == small.inline_bytes);

  // Inline up to what a same-host lane carries (kLaneInlineMaxBytes), not a byte more.
  tp::TensorDescriptor lane;
  lane.dtype = DType::U8;
  lane.shape = {std::int64_t(tp::kLaneInlineMaxBytes)};
  lane.nbytes = tp::kLaneInlineMaxBytes;
  lane.is_inline = true;
  lane.inline_bytes = std::vector<char>(tp::kLaneInlineMaxBytes, 'y');
  auto wire = tp::encode(lane);
  CHECK(tp::decode_descriptor(wire).inline_bytes == lane.inline_bytes);
  lane.shape = {std::int64_t(tp::kLaneInlineMaxBytes + 1)};
  lane.nbytes = tp::kLaneInlineMaxBytes + 1;
  lane.inline_bytes.push_back('y');
  CHECK_THROWS_AS(tp::encode(lane), troupe::ErrorException);   // a sender cannot make one...
  // ...and a decoder refuses one a peer wrote anyway: the same bytes with shape, nbytes and len
  // one larger (u32 magic, 4 u8, then i64 shape[1] at 8, u64 nbytes at 16, u32 len at 24) and a
  // byte more.
  const auto put_le = [&](std::size_t at, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) wire[at + std::size_t(i)] = char((v >> (8 * i)) & 0xff);
  };
  put_le(8, tp::kLaneInlineMaxBytes + 1, 8);
  put_le(16, tp::kLaneInlineMaxBytes + 1, 8);
  put_le(24, tp::kLaneInlineMaxBytes + 1, 4);
  wire.push_back('y');
  CHECK_THROWS_WITH_AS(tp::decode_descriptor(wire), doctest::Contains("inline payload too large"), troupe::ErrorException);
}

TEST_CASE("transport: malformed or truncated descriptor bytes are rejected") {
  auto good = tp::encode(sample_remote());
  for (std::size_t n = 0; n < good.size(); ++n) {
    CHECK_THROWS_AS(tp::decode_descriptor(good.data(), n), troupe::ErrorException);
  }
  auto corrupt = [&](std::size_t at, char v) {
    auto b = good;
    b[at] = v;
    return b;
  };
  CHECK_THROWS_AS(tp::decode_descriptor(corrupt(0, 'X')), troupe::ErrorException);      // magic
  CHECK_THROWS_AS(tp::decode_descriptor(corrupt(4, 9)), troupe::ErrorException);        // version
  CHECK_THROWS_AS(tp::decode_descriptor(corrupt(5, 4)), troupe::ErrorException);        // flags
  CHECK_THROWS_AS(tp::decode_descriptor(corrupt(6, 77)), troupe::ErrorException);       // dtype
  CHECK_THROWS_AS(tp::decode_descriptor(corrupt(7, 100)), troupe::ErrorException);      // ndim
  CHECK_THROWS_AS(tp::decode_descriptor(corrupt(8, 5)), troupe::ErrorException);        // shape vs nbytes
  CHECK_THROWS_AS(tp::decode_descriptor(corrupt(15, char(0x80))), troupe::ErrorException);   // negative dim
  auto trailing = good;
  trailing.push_back(0);
  CHECK_THROWS_AS(tp::decode_descriptor(trailing), troupe::ErrorException);
  auto bad_len = sample_remote();
  bad_len.rkey.clear();
  CHECK_THROWS_AS(tp::encode(bad_len), troupe::ErrorException);
  try {
    tp::decode_descriptor(corrupt(0, 'X'));
  } catch (const troupe::ErrorException& e) {
    CHECK(e.code() == troupe::TransportCode::BadDescriptor);
  }
}

TEST_CASE("transport: small tensors travel inline and need no peer") {
  tp::DataPlane plane;
  auto t = TensorView::empty(DType::F32, {4, 8});
  fill(t.data, t.nbytes(), 11);
  auto d = plane.expose(t);
  CHECK(d.is_inline);
  CHECK(d.region == 0);
  auto back = plane.fetch(tp::decode_descriptor(tp::encode(d)), milliseconds(1000));
  CHECK(back.shape == t.shape);
  CHECK(reinterpret_cast<std::uintptr_t>(back.data) % 64 == 0);
  CHECK(first_mismatch(back.data, back.nbytes(), 11) == back.nbytes());
  CHECK(plane.stats().regions == 0);

  auto strided = t;   // transposed view: inline bytes come out row-major
  strided.shape = {8, 4};
  strided.strides = {1, 8};
  auto sd = plane.expose(strided);
  auto* src = t.data_as<float>();
  auto sb = plane.fetch(sd, milliseconds(1000));
  CHECK(sb.data_as<float>()[1] == src[8]);
  CHECK(sb.data_as<float>()[4] == src[1]);

  // Past kInlineMaxBytes, inline_descriptor (what a lane link's sender uses, up to
  // kLaneInlineMaxBytes) carries a strided view's bytes row-major too, with no region.
  auto big = TensorView::empty(DType::F32, {256, 128});   // 128 KiB
  for (std::int64_t i = 0; i < 256 * 128; ++i) big.data_as<float>()[i] = float(i);
  auto big_t = big;
  big_t.shape = {128, 256};
  big_t.strides = {1, 128};
  auto bd = tp::inline_descriptor(big_t);
  CHECK(bd.is_inline);
  CHECK(bd.region == 0);
  auto bb = plane.fetch(tp::decode_descriptor(tp::encode(bd)), milliseconds(1000));
  CHECK(bb.shape == big_t.shape);
  CHECK(bb.data_as<float>()[1] == big.data_as<float>()[128]);
  CHECK(bb.data_as<float>()[256] == big.data_as<float>()[1]);
  CHECK(plane.stats().regions == 0);
}

TEST_CASE("transport: a strided view is exposed as one contiguous copy and released") {
  tp::DataPlane plane;
  const std::int64_t rows = 512, cols = 256;   // 512 KiB of f32
  auto t = TensorView::empty(DType::F32, {rows, cols});
  for (std::int64_t i = 0; i < rows * cols; ++i) t.data_as<float>()[i] = float(i);
  auto view = t;
  view.shape = {cols, rows};
  view.strides = {1, cols};
  auto d = plane.expose(view);
  CHECK_FALSE(d.is_inline);
  CHECK(plane.stats().regions == 1);
  auto back = plane.fetch(tp::decode_descriptor(tp::encode(d)), milliseconds(5000));   // via UCX self
  bool same = true;
  for (std::int64_t r = 0; r < cols && same; ++r)
    for (std::int64_t c = 0; c < rows; ++c) same = same && back.data_as<float>()[r * rows + c] == float(c * cols + r);
  CHECK(same);
  plane.release(d.region);
  plane.release(d.region);   // twice is harmless
  CHECK(plane.stats().regions == 0);
}

TEST_CASE("transport: an expired lease releases its region") {
  tp::DataPlane plane;
  auto t = plane.allocate(DType::U8, {1 << 20});
  auto d = plane.expose(t, {milliseconds(50), false});
  CHECK(plane.stats().regions == 1);
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (plane.stats().regions != 0 && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(20));
  CHECK(plane.stats().regions == 0);
  t = TensorView{};
  CHECK(plane.stats().allocations == 0);
}

TEST_CASE("transport: a 256 MiB tensor moved between two processes arrives bit-identical") {
  const std::size_t n = std::size_t(256) << 20;
  Helper helper("alloc", n, 42);   // spawned before this process touches UCX
  tp::DataPlane plane;
  auto bytes = helper.descriptor(std::chrono::seconds(30));
  REQUIRE_FALSE(bytes.empty());
  auto d = tp::decode_descriptor(bytes);
  CHECK(d.nbytes == n);
  auto t = plane.fetch(d, std::chrono::seconds(30));
  CHECK(reinterpret_cast<std::uintptr_t>(t.data) % 64 == 0);
  CHECK(first_mismatch(t.data, n, 42) == n);
  CHECK(helper.finish());
}

TEST_CASE("transport: ordinary and strided memory is pulled bit-identical from another process") {
  for (const char* mode : {"plain", "strided"}) {
    CAPTURE(mode);
    const std::size_t n = std::size_t(8) << 20;
    Helper helper(mode, n, 7);
    tp::DataPlane plane;
    auto bytes = helper.descriptor(std::chrono::seconds(30));
    REQUIRE_FALSE(bytes.empty());
    auto t = plane.fetch(tp::decode_descriptor(bytes), std::chrono::seconds(30));
    if (std::strcmp(mode, "plain") == 0) {
      CHECK(first_mismatch(t.data, n, 7) == n);
    } else {   // transposed [n/2, 2] view of the filled bytes
      std::vector<unsigned char> want(n);
      fill(want.data(), n, 7);
      auto* got = static_cast<unsigned char*>(t.data);
      CHECK(got[1] == want[n / 2]);
      CHECK(got[2] == want[1]);
      CHECK(got[n - 1] == want[n - 1]);
    }
    CHECK(helper.finish());
  }
}

TEST_CASE("transport: an idle owner serves gets over TCP (its progress thread answers)") {
  ::setenv("UCX_TLS", "tcp", 1);
  const std::size_t n = std::size_t(16) << 20;
  Helper helper("alloc", n, 5, "tcp");
  {
    tp::DataPlane plane;
    auto bytes = helper.descriptor(std::chrono::seconds(30));
    ::unsetenv("UCX_TLS");
    REQUIRE_FALSE(bytes.empty());
    auto t = plane.fetch(tp::decode_descriptor(bytes), std::chrono::seconds(30));
    CHECK(first_mismatch(t.data, n, 5) == n);
  }
  ::unsetenv("UCX_TLS");
  CHECK(helper.finish());
}

TEST_CASE("transport: a fetch from a dead peer fails within its timeout") {
  for (const char* tls : {"", "tcp"}) {
    CAPTURE(tls);
    if (*tls != 0) ::setenv("UCX_TLS", tls, 1);
    Helper helper("alloc", std::size_t(32) << 20, 3, tls);
    tp::DataPlane plane;
    ::unsetenv("UCX_TLS");
    auto bytes = helper.descriptor(std::chrono::seconds(30));
    REQUIRE_FALSE(bytes.empty());
    helper.kill_now();
    auto t0 = Clock::now();
    bool threw = false;
    try {
      plane.fetch(tp::decode_descriptor(bytes), milliseconds(2000));
    } catch (const troupe::ErrorException& e) {
      threw = true;
      std::string msg = std::string("dead peer (UCX_TLS='") + tls + "'): " + e.what();
      MESSAGE(msg);
    }
    CHECK(threw);
    CHECK(Clock::now() - t0 < std::chrono::seconds(8));
  }
}
