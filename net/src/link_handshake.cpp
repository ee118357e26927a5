// Who is at the other end of a link (identities, whether a peer's process has exited) and the
// token handshake that opens every link (link_impl.hpp).
#include "link_impl.hpp"   // first: it includes <utility> before Boost.Asio

#include <charconv>
#include <cstring>

#include <msgpack.hpp>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <unistd.h>

#include "troupe/error.hpp"
#include "troupe/proc_file.hpp"

namespace troupe::net {
namespace {

constexpr std::uint32_t kMaxHandshakeFrame = 4096;
// The handshake: the acceptor's challenge, the connector's proof, the acceptor's answer.
constexpr char kChallenge = 'A', kProof = 'B', kAccepted = 'D', kRefusedFrame = 'E';
constexpr std::size_t kNonce = 32;
using Nonce = std::array<unsigned char, kNonce>;

Nonce fresh_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1) throw std::runtime_error("links: no random bytes");
  return n;
}

Bytes bytes(const std::vector<char>& v) { return {reinterpret_cast<const unsigned char*>(v.data()), v.size()}; }
template <std::size_t N>
Bytes bytes(const std::array<unsigned char, N>& a) { return {a.data(), a.size()}; }

// A role byte in each proof, so that one side's proof offered back to it does not verify.
const unsigned char kConnectorRole[] = {'C'}, kAcceptorRole[] = {'S'};

// Four fields from a build before kWireVersion (version 0), five since; more are a later build's
// (its version, the fifth, says so).
PeerIdentity decode_identity(const char* data, std::size_t size) {
  std::size_t off = 0;
  msgpack::unpack_limit limits(/*array*/ 8, /*map*/ 0, /*str*/ 1024, /*bin*/ 0, /*ext*/ 0, /*depth*/ 2);
  auto h = msgpack::unpack(data, size, off, nullptr, nullptr, limits);
  const auto& o = h.get();
  if (off != size || o.type != msgpack::type::ARRAY || o.via.array.size < 4) throw std::runtime_error("bad identity");
  PeerIdentity id;
  o.via.array.ptr[0].convert(id.host);
  o.via.array.ptr[1].convert(id.pid);
  o.via.array.ptr[2].convert(id.start_time);
  o.via.array.ptr[3].convert(id.role);
  id.wire_version = 0;
  if (o.via.array.size > 4) o.via.array.ptr[4].convert(id.wire_version);
  return id;
}

// Why `peer` cannot link with `self` (kWireVersion, but for a test's hub), in `self`'s words; ""
// when they agree. version_mismatch(peer, self) is the same in the peer's words.
std::string version_mismatch(const PeerIdentity& self, const PeerIdentity& peer) {
  if (peer.wire_version == self.wire_version) return "";
  return "the peer (" + peer.role + " on " + peer.host + ") speaks troupe wire version " +
         std::to_string(peer.wire_version) + (peer.wire_version == 0 ? " (a build from before versions)" : "") +
         ", this process " + std::to_string(self.wire_version) + ": a cluster runs one troupe build";
}

// A refusal's reason as the refused side shows it: printable ASCII, bounded.
std::string printable_reason(const std::vector<char>& body) {
  std::string out;
  for (char c : body) {
    if (out.size() == 512) break;
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return out;
}

char process_state(std::uint32_t pid) {
  const auto fields = proc_stat_fields(pid);
  return fields.empty() || fields[0].empty() ? '\0' : fields[0][0];
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

asio::awaitable<bool> read_frame(tcp::socket& s, std::uint32_t max, char& kind, std::uint8_t& flags,
                                 std::vector<char>& body) {
  boost::system::error_code ec;
  unsigned char h[6];
  co_await asio::async_read(s, asio::buffer(h, sizeof h), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return false;
  const auto size = parse_header(h, max, kind, flags);
  if (!size) co_return false;
  body.resize(*size);
  if (!body.empty()) {
    co_await asio::async_read(s, asio::buffer(body), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
  }
  co_return true;
}

asio::awaitable<bool> write_small(tcp::socket& s, char kind, const std::vector<char>& body) {
  std::vector<char> f(6 + body.size());
  put_header(f.data(), std::uint32_t(body.size()), kind, 0);
  std::copy(body.begin(), body.end(), f.begin() + 6);
  boost::system::error_code ec;
  co_await asio::async_write(s, asio::buffer(f), asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec;
}

}  // namespace

Hmac::Hmac(const std::string& key) : mac_(EVP_MAC_fetch(nullptr, "HMAC", nullptr)) {
  tmpl_ = mac_ != nullptr ? EVP_MAC_CTX_new(mac_) : nullptr;
  char md[] = "SHA256";
  OSSL_PARAM p[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, md, 0), OSSL_PARAM_construct_end()};
  if (tmpl_ == nullptr ||
      EVP_MAC_init(tmpl_, reinterpret_cast<const unsigned char*>(key.data()), key.size(), p) != 1) {
    throw std::runtime_error("links: cannot set up HMAC-SHA256");
  }
}

Hmac::~Hmac() {
  EVP_MAC_CTX_free(tmpl_);
  EVP_MAC_free(mac_);
}

Tag Hmac::operator()(std::initializer_list<Bytes> parts) const {
  EVP_MAC_CTX* c = EVP_MAC_CTX_dup(tmpl_);
  bool ok = c != nullptr;
  for (Bytes b : parts) ok = ok && EVP_MAC_update(c, b.data(), b.size()) == 1;
  Tag t{};
  std::size_t n = 0;
  ok = ok && EVP_MAC_final(c, t.data(), &n, t.size()) == 1 && n == t.size();
  EVP_MAC_CTX_free(c);
  if (!ok) throw std::runtime_error("links: HMAC failed");
  return t;
}

std::vector<char> encode_identity(const PeerIdentity& id) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(5);
  pk.pack(id.host);
  pk.pack(id.pid);
  pk.pack(id.start_time);
  pk.pack(id.role);
  pk.pack(id.wire_version);
  return std::vector<char>(buf.data(), buf.data() + buf.size());
}

std::uint64_t process_start_time(std::uint32_t pid) {
  const auto fields = proc_stat_fields(pid);
  if (fields.size() < 20) return 0;
  const std::string& start = fields[19];   // field 22, starttime
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(start.data(), start.data() + start.size(), v);
  return ec == std::errc() ? v : 0;
}

PeerIdentity self_identity(std::string role) {
  PeerIdentity id;
  id.host = hostname();
  id.pid = std::uint32_t(::getpid());
  id.start_time = process_start_time(id.pid);
  id.role = std::move(role);
  return id;
}

bool peer_exited(const PeerIdentity& peer) {
  if (peer.host != hostname() || peer.pid == 0) return false;
  char state = process_state(peer.pid);
  if (state == '\0' || state == 'Z' || state == 'X') return true;   // gone, or a zombie not yet reaped
  return peer.start_time != 0 && process_start_time(peer.pid) != peer.start_time;   // the pid is reused
}

// The acceptor's side. Returns the peer's identity; throws ErrorException on a refusal.
asio::awaitable<PeerIdentity> accept_handshake(LinkHub::Impl& hub, tcp::socket& s) {
  const Nonce ns = fresh_nonce();
  if (!co_await write_small(s, kChallenge, std::vector<char>(ns.begin(), ns.end()))) {
    throw ErrorException(Error{NetCode::Unreachable, "the peer went away during the handshake"});
  }
  char kind = 0;
  std::uint8_t flags = 0;
  std::vector<char> body;
  if (!co_await read_frame(s, kMaxHandshakeFrame, kind, flags, body) || kind != kProof ||
      body.size() <= kNonce + kTag) {
    throw ErrorException(Error{NetCode::Refused, "no valid proof (not a troupe process?)"});
  }
  Nonce nc{};
  Tag given{};
  std::memcpy(nc.data(), body.data(), kNonce);
  std::memcpy(given.data(), body.data() + kNonce, kTag);
  std::vector<char> ident(body.begin() + kNonce + kTag, body.end());
  const Tag want = hub.hmac({Bytes(kConnectorRole), bytes(ns), bytes(nc), bytes(ident)});
  if (CRYPTO_memcmp(want.data(), given.data(), kTag) != 0) {
    co_await write_small(s, kRefusedFrame, {});
    throw ErrorException(Error{NetCode::Refused, "missing or wrong cluster token"});
  }
  PeerIdentity peer;
  try {
    peer = decode_identity(ident.data(), ident.size());
  } catch (const std::exception& e) {
    throw ErrorException(Error{NetCode::Refused, std::string("a malformed identity: ") + e.what()});
  }
  // The acceptor decides (a later build may accept an earlier one) and tells the peer why.
  if (const std::string why = version_mismatch(hub.self, peer); !why.empty()) {
    const std::string theirs = version_mismatch(peer, hub.self);
    co_await write_small(s, kRefusedFrame, std::vector<char>(theirs.begin(), theirs.end()));
    throw ErrorException(Error{NetCode::Refused, why});
  }
  const Tag mine = hub.hmac({Bytes(kAcceptorRole), bytes(nc), bytes(ns), bytes(hub.self_bytes)});
  std::vector<char> answer(mine.begin(), mine.end());
  answer.insert(answer.end(), hub.self_bytes.begin(), hub.self_bytes.end());
  if (!co_await write_small(s, kAccepted, answer)) {
    throw ErrorException(Error{NetCode::Unreachable, "the peer went away during the handshake"});
  }
  co_return peer;
}

// The connector's side.
asio::awaitable<PeerIdentity> connect_handshake(LinkHub::Impl& hub, tcp::socket& s) {
  char kind = 0;
  std::uint8_t flags = 0;
  std::vector<char> body;
  if (!co_await read_frame(s, kMaxHandshakeFrame, kind, flags, body) || kind != kChallenge || body.size() != kNonce) {
    throw ErrorException(Error{NetCode::Refused, "no challenge: not a troupe link"});
  }
  Nonce ns{};
  std::memcpy(ns.data(), body.data(), kNonce);
  const Nonce nc = fresh_nonce();
  const Tag proof = hub.hmac({Bytes(kConnectorRole), bytes(ns), bytes(nc), bytes(hub.self_bytes)});
  std::vector<char> out(nc.begin(), nc.end());
  out.insert(out.end(), proof.begin(), proof.end());
  out.insert(out.end(), hub.self_bytes.begin(), hub.self_bytes.end());
  if (!co_await write_small(s, kProof, out)) {
    throw ErrorException(Error{NetCode::Unreachable, "the peer went away during the handshake"});
  }
  if (!co_await read_frame(s, kMaxHandshakeFrame, kind, flags, body)) {
    throw ErrorException(Error{NetCode::Refused, "the peer closed the handshake"});
  }
  if (kind == kRefusedFrame) {   // an empty reason is the token's (and every build before reasons)
    throw ErrorException(Error{NetCode::Refused, body.empty() ? "refused: missing or wrong cluster token"
                                                               : "refused: " + printable_reason(body)});
  }
  if (kind != kAccepted || body.size() <= kTag) throw ErrorException(Error{NetCode::Refused, "a malformed answer"});
  std::vector<char> ident(body.begin() + kTag, body.end());
  const Tag want = hub.hmac({Bytes(kAcceptorRole), bytes(nc), bytes(ns), bytes(ident)});
  if (CRYPTO_memcmp(want.data(), body.data(), kTag) != 0) {
    throw ErrorException(Error{NetCode::Refused, "the peer does not hold the cluster token"});
  }
  try {
    co_return decode_identity(ident.data(), ident.size());
  } catch (const std::exception& e) {
    throw ErrorException(Error{NetCode::Refused, std::string("a malformed identity: ") + e.what()});
  }
}

}  // namespace troupe::net
