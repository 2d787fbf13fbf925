// How a TcpStore client and its server prove to each other that they belong to one job.
//
// Note [Handshake]
// The store token never crosses the wire: a process that took the port first (a stranger
// on this machine, or another job's store) learns nothing from a client, and a client
// learns at once that it reached the wrong server. Each side proves that it knows the
// token by an HMAC-SHA-256 keyed with it over fresh nonces, and the job's identity (its
// run id) travels as a digest, so one job's processes never join another's store even
// when both have the same token:
//   1. client -> server  hello: "DPST", u8 version (2), bytes client nonce (16),
//                        bytes run digest (32)
//   2. server -> client  kOk, bytes server nonce (16), bytes server proof (32); or
//                        kRefused and why (another job's run id, another version), then closes
//   3. the client checks the server's proof, and leaves a server that cannot give it;
//      client -> server  bytes client proof (32)
//   4. server -> client  kOk; or kRefused (the token does not match), then closes
// proof(side) = HMAC(token, label of side | client nonce | server nonce | run digest).
// The labels differ, so a server's proof never passes as a client's; the nonces are fresh
// on both sides, so a proof seen once is worth nothing again. Until step 4 the connection
// is a stranger to the server (Note [Strangers] in store_service.h).
#pragma once

#include <string>

#include "datapar/rendezvous/store.h"

namespace datapar::detail::handshake {

constexpr size_t kNonceBytes = 16;
constexpr size_t kDigestBytes = 32;

enum class Side { kServer, kClient };

// The digest of a run id, as the hello carries it (and as a FileStore writes it).
Bytes run_digest(const std::string& run_id);

// The proof that `side` knows `token`, for these nonces and run digest.
Bytes proof(const std::string& token, Side side, const Bytes& client_nonce, const Bytes& server_nonce,
            const Bytes& run_digest);

// kNonceBytes random bytes. Throws Error if the kernel gives none.
Bytes fresh_nonce();

// a == b in time that depends on their length only.
bool same_bytes(const Bytes& a, const Bytes& b);

}  // namespace datapar::detail::handshake
