// See sha256.h.
#include "sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "datapar/error.h"

namespace datapar::detail {
namespace {

[[noreturn]] void failed(const char* what) {
  char reason[256] = "no reason given";
  if (const unsigned long code = ERR_get_error()) ERR_error_string_n(code, reason, sizeof(reason));
  ERR_clear_error();
  throw Error(str_cat(what, " failed in OpenSSL's libcrypto: ", reason));
}

}  // namespace

void Sha256::Free::operator()(evp_md_ctx_st* ctx) const { EVP_MD_CTX_free(ctx); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) failed("SHA-256");
}

Sha256& Sha256::update(const void* data, size_t size) {
  if (EVP_DigestUpdate(ctx_.get(), data, size) != 1) failed("SHA-256");
  return *this;
}

Sha256Digest Sha256::finish() {
  Sha256Digest out;
  if (EVP_DigestFinal_ex(ctx_.get(), out.data(), nullptr) != 1) failed("SHA-256");
  return out;
}

Sha256Digest sha256(const std::string& data) { return Sha256().update(data).finish(); }

Sha256Digest hmac_sha256(const std::string& key, const std::string& message) {
  Sha256Digest out;
  unsigned int size = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
            message.size(), out.data(), &size) ||
      size != out.size()) {
    failed("HMAC-SHA-256");
  }
  return out;
}

}  // namespace datapar::detail
