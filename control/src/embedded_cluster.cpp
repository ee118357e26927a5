// control/'s side of the embedded cluster (troupe/embedded_cluster.hpp): a head and a node daemon
// on 127.0.0.1 in a session of their own, registered with the runtime at static initialisation.
#include "troupe/embedded_cluster.hpp"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "troupe/control/head.hpp"
#include "troupe/control/node_daemon.hpp"
#include "troupe/net/session.hpp"
#include "troupe/net/token.hpp"

namespace troupe::control {
namespace {

class LocalCluster final : public EmbeddedCluster {
 public:
  explicit LocalCluster(const EmbeddedClusterSpec& spec)
      : session_(net::make_session_dir(spec.session_root, /*latest=*/false)), token_(net::random_token()) {
    // A session of its own: the machine's latest stays the last `troupe start` (troupe status
    // --all lists this one too, while it runs).
    net::write_private_file((std::filesystem::path(session_) / "token").string(), token_ + "\n");
    HeadConfig hc;
    hc.token = token_;
    hc.session_dir = session_;
    head_ = std::make_unique<Head>(hc);
    std::ofstream(std::filesystem::path(session_) / "head_address") << head_->address() << "\n";
    std::ofstream(std::filesystem::path(session_) / "embedded") << ::getpid() << "\n";
    DaemonConfig dc;
    dc.head_port = head_->port();
    dc.token = token_;
    dc.session_dir = session_;
    node_ = std::make_unique<NodeDaemon>(dc);
    node_->start(std::chrono::seconds(10));
    spdlog::info("embedded cluster at {} (session {})", head_->address(), session_);
  }
  ~LocalCluster() override { stop(); }

  std::string host() const override { return "127.0.0.1"; }
  std::uint16_t port() const override { return head_->port(); }
  const std::string& token() const override { return token_; }
  const std::string& session_dir() const override { return session_; }
  void stop() override {
    node_->stop();   // terminates its worker processes
    head_->stop();
  }

 private:
  std::string session_;
  std::string token_;
  std::unique_ptr<Head> head_;
  std::unique_ptr<NodeDaemon> node_;
};

std::unique_ptr<EmbeddedCluster> make_local_cluster(const EmbeddedClusterSpec& spec) {
  return std::make_unique<LocalCluster>(spec);
}

const bool kRegistered = (set_embedded_cluster_factory(&make_local_cluster), true);

}  // namespace
}  // namespace troupe::control

// Named by troupe::troupe's link options (-u), so that a program's link keeps this file, and with
// it the registration above, though nothing else in the program refers to it.
extern "C" const bool troupe_embedded_cluster_anchor = troupe::control::kRegistered;
