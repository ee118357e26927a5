#include "troupe/net/digest.hpp"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace troupe::net {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  if (ctx_->md == nullptr || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_->md);
    throw std::runtime_error("SHA-256 is not available from OpenSSL");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_->md); }

void Sha256::update(const void* data, std::size_t size) {
  if (size > 0) EVP_DigestUpdate(ctx_->md, data, size);
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, digest, &len);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string sha256_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  Sha256 h;
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) h.update(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw std::runtime_error("cannot read " + path);
  return h.hex();
}

bool is_sha256_hex(const std::string& text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace troupe::net
