// SHA-256 (OpenSSL), for content-addressed job packages: the digest names the bytes, so an
// upload or a download is checked against the name it was asked for.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace troupe::net {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, std::size_t size);
  std::string hex();   // the digest of what was given, as 64 lowercase hex characters; once

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// The digest of a file's bytes. Throws std::runtime_error when it cannot be read.
std::string sha256_file(const std::string& path);

// True for 64 lowercase hex characters (what hex() makes): the only names a package may have.
bool is_sha256_hex(const std::string& text);

}  // namespace troupe::net
