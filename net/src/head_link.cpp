#include "troupe/net/head_link.hpp"

#include <algorithm>
#include <stdexcept>

#include "frame_header.hpp"
#include "troupe/error.hpp"

namespace troupe::net {

using json = nlohmann::json;

bool json_nesting_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

json decode_control(const std::vector<char>& body) {
  if (body.size() > kMaxControlMessage) throw std::runtime_error("a control message over " + std::to_string(kMaxControlMessage) + " bytes");
  if (!json_nesting_within(std::string_view(body.data(), body.size())))
    throw std::runtime_error("a control message nested deeper than " + std::to_string(kMaxJsonDepth));
  json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) throw std::runtime_error("a control message that is not JSON");
  if (!parsed.is_object()) throw std::runtime_error("a control message that is not a JSON object");
  return parsed;
}

std::vector<char> encode_control(const json& body) {
  const std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxControlMessage) throw std::length_error("a control message over " + std::to_string(kMaxControlMessage) + " bytes");
  return std::vector<char>(text.begin(), text.end());
}

struct HeadSession::State {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<json> welcome;
  std::deque<Message> queue;
  bool ended = false;
  std::string why;
  bool woken = false;   // waker(): the next wait returns at once
};

HeadSession::HeadSession(LinkHub& hub, const std::string& address, const json& hello, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()), address_(address) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::weak_ptr<State> weak = state_;
  auto on_message = [weak](Link& link, char kind, std::vector<char>& body) {
    auto s = weak.lock();
    if (!s) return;
    json parsed;
    try {
      parsed = decode_control(body);
    } catch (const std::exception& e) {
      link.close(std::string("the head sent a bad message: ") + e.what());
      return;
    }
    std::lock_guard lk(s->mu);
    if (!s->welcome) {
      if (kind != head_kind::kWelcome) {
        link.close("the head sent something before its welcome");
        return;
      }
      s->welcome = std::move(parsed);
    } else if (kind == head_kind::kOrder || kind == head_kind::kDirectory || kind == head_kind::kWelcome) {
      s->queue.push_back(Message{kind, std::move(parsed)});
    } else {
      link.close(std::string("the head sent a message of unknown kind '") + kind + "'");
      return;
    }
    s->cv.notify_all();
  };
  auto on_closed = [weak](Link&, LinkEnd, const std::string& why) {
    auto s = weak.lock();
    if (!s) return;
    std::lock_guard lk(s->mu);
    s->ended = true;
    s->why = why;
    s->cv.notify_all();
  };
  link_ = hub.connect(address, on_message, on_closed, timeout);   // throws Unreachable / Refused
  if (!link_->send(head_kind::kHello, encode_control(hello))) {
    throw ErrorException(Error{NetCode::Unreachable, "the head at " + address + " closed the link before the hello"});
  }
  std::unique_lock lk(state_->mu);
  if (!state_->cv.wait_until(lk, deadline, [&] { return state_->welcome.has_value() || state_->ended; })) {
    lk.unlock();
    link_->close("no welcome in time");
    throw ErrorException(Error{NetCode::Unreachable, "the head at " + address + " sent no welcome in time"});
  }
  if (!state_->welcome) {
    throw ErrorException(Error{NetCode::Unreachable, "the head at " + address + " closed the link: " + state_->why});
  }
  welcome_ = *state_->welcome;
  if (welcome_.contains("error")) {
    const std::string why = welcome_.value("error", std::string("refused"));
    lk.unlock();
    link_->close("refused");
    throw ErrorException(Error{NetCode::Refused, "the head refused: " + why});
  }
}

std::vector<char> encode_log(const LogPiece& piece) {
  std::vector<char> out(16 + piece.data.size());
  put_le<std::uint64_t>(out.data(), piece.job);
  put_le<std::uint64_t>(out.data() + 8, piece.worker);
  std::copy(piece.data.begin(), piece.data.end(), out.begin() + 16);
  return out;
}

LogPiece decode_log(const std::vector<char>& body) {
  if (body.size() < 16 || body.size() > 16 + kMaxLogPiece) throw std::runtime_error("a log piece of a bad size");
  LogPiece p;
  p.job = get_le<std::uint64_t>(body.data());
  p.worker = get_le<std::uint64_t>(body.data() + 8);
  p.data.assign(body.begin() + 16, body.end());
  return p;
}

HeadSession::~HeadSession() { close(); }

std::optional<HeadSession::Message> HeadSession::next(std::chrono::milliseconds timeout) {
  std::unique_lock lk(state_->mu);
  state_->cv.wait_for(lk, timeout, [&] { return !state_->queue.empty() || state_->ended || state_->woken; });
  state_->woken = false;
  if (!state_->queue.empty()) {
    Message m = std::move(state_->queue.front());
    state_->queue.pop_front();
    return m;
  }
  if (state_->ended) return Message{0, json{{"why", state_->why}}};
  return std::nullopt;
}

std::function<void()> HeadSession::waker() const {
  return [weak = std::weak_ptr<State>(state_)] {
    auto s = weak.lock();
    if (!s) return;
    {
      std::lock_guard lk(s->mu);
      s->woken = true;
    }
    s->cv.notify_all();
  };
}

bool HeadSession::send(char kind, const json& body) { return link_ && link_->send(kind, encode_control(body)); }

bool HeadSession::send_bytes(char kind, const std::vector<char>& body) { return link_ && link_->send(kind, body); }

void HeadSession::close() {
  if (link_) link_->close("closed here");
}

bool HeadSession::ended() const {
  std::lock_guard lk(state_->mu);
  return state_->ended;
}

}  // namespace troupe::net
