// SHA-256 and HMAC-SHA-256, by OpenSSL's libcrypto, for the store's handshake (Note
// [Handshake] in rendezvous/store_handshake.h) and for run ids that must not be written in
// clear.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of the callers' includes

namespace datapar::detail {

using Sha256Digest = std::array<uint8_t, 32>;

// Throws Error if libcrypto fails (out of memory).
class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, size_t size);
  Sha256& update(const std::string& s) { return update(s.data(), s.size()); }
  // The digest of everything given. The object is spent afterwards.
  Sha256Digest finish();

 private:
  struct Free {
    void operator()(evp_md_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_md_ctx_st, Free> ctx_;
};

Sha256Digest sha256(const std::string& data);

// HMAC-SHA-256 of `message` under `key`.
Sha256Digest hmac_sha256(const std::string& key, const std::string& message);

}  // namespace datapar::detail
