// See store_handshake.h.
#include "rendezvous/store_handshake.h"

#include <cerrno>
#include <cstring>

#include "datapar/error.h"
#include "random_bytes.h"
#include "sha256.h"

namespace datapar::detail::handshake {
namespace {

Bytes as_bytes(const Sha256Digest& d) { return Bytes(d.begin(), d.end()); }

}  // namespace

Bytes run_digest(const std::string& run_id) {
  return as_bytes(sha256(std::string("datapar run id", 15) + run_id));  // the label's NUL included
}

Bytes proof(const std::string& token, Side side, const Bytes& client_nonce, const Bytes& server_nonce,
            const Bytes& run_digest) {
  const std::string label = side == Side::kServer ? std::string("datapar store server", 21)
                                                  : std::string("datapar store client", 21);
  return as_bytes(hmac_sha256(token, label + as_text(client_nonce) + as_text(server_nonce) + as_text(run_digest)));
}

Bytes fresh_nonce() {
  Bytes nonce(kNonceBytes);
  if (!fill_random(nonce.data(), nonce.size())) {
    throw Error(str_cat("TcpStore: cannot read random bytes for the store's handshake: ", std::strerror(errno)));
  }
  return nonce;
}

bool same_bytes(const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return false;
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace datapar::detail::handshake
