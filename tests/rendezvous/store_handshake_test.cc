// The store's handshake (Note [Handshake] in src/rendezvous/store_handshake.h) against values
// recorded from the hand-written SHA-256 and HMAC it used before OpenSSL's libcrypto (issue
// 51), and checked with Python's hashlib and hmac: the run digest a hello carries and a
// FileStore writes, both sides' proofs, and a whole exchange byte for byte. A process of
// this datapar and one of the previous version therefore complete the handshake together,
// and a FileStore written by either is the same job's to the other.
#include <gtest/gtest.h>

#include <string>

#include "datapar/rendezvous/store.h"
#include "random_bytes.h"
#include "rendezvous/store_handshake.h"
#include "rendezvous/store_service.h"
#include "rendezvous/tcp_wire.h"

namespace datapar::detail {
namespace {

namespace hs = handshake;

// The recorded inputs: a token as store_token.cc generates them (32 hex digits), one longer
// than an HMAC block (hashed first), fixed nonces and a run id.
const std::string kRecordedToken = "0123456789abcdef0123456789abcdef";
const std::string kRecordedLongToken(100, 'T');
const std::string kRecordedRun = "run-issue-51";

Bytes recorded_client_nonce() {
  Bytes n(hs::kNonceBytes);
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(i);
  return n;
}

Bytes recorded_server_nonce() {
  Bytes n(hs::kNonceBytes);
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(0xf0 + i);
  return n;
}

std::string handshake_hex(const Bytes& b) { return to_hex(b.data(), b.size()); }

Bytes bytes_of_hex(const std::string& hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

TEST(StoreHandshake, RunDigestsAsRecorded) {
  EXPECT_EQ(handshake_hex(hs::run_digest("")), "206ed1df794f6c070a1879fcd3e6ce27d1d34654da1742571b70043d0c1ab74f");
  EXPECT_EQ(handshake_hex(hs::run_digest(kRecordedRun)),
            "7720ef04b8b26625bd56f0affabb380d031b5e1663eb3659a921a61fe725cc7d");
}

TEST(StoreHandshake, ProofsAsRecorded) {
  const Bytes run = hs::run_digest(kRecordedRun);
  const Bytes client = recorded_client_nonce(), server = recorded_server_nonce();
  EXPECT_EQ(handshake_hex(hs::proof(kRecordedToken, hs::Side::kServer, client, server, run)),
            "7826622d20ecfaf706fbfe98699b446d55bfdc94d7b103bb81e2057485fa786a");
  EXPECT_EQ(handshake_hex(hs::proof(kRecordedToken, hs::Side::kClient, client, server, run)),
            "d8ab724a2407601e4b50e77e7e2655d3d72132f42aeb46b9edd2b864b72fa9c3");
  EXPECT_EQ(handshake_hex(hs::proof(kRecordedLongToken, hs::Side::kServer, client, server, run)),
            "49072cca527e07744c7a99398d6e4af3fb6b1390b60461b16bba4b1eaf74e9f7");
  EXPECT_EQ(handshake_hex(hs::proof(kRecordedLongToken, hs::Side::kClient, client, server, run)),
            "1f4fc97d8df6e5a964aa736978f0bf2b249bb54fdc30c050492a4f04e4737374");
}

// A client of the previous version, as its bytes on the wire: today's server answers it with
// the bytes the previous server sent, and accepts its proof.
TEST(StoreHandshake, AServerCompletesARecordedClientsHandshake) {
  StoreService service(kRecordedToken, kRecordedRun, {}, [] { return recorded_server_nonce(); });
  const auto now = StoreService::Clock::now();
  const StoreService::Id id = service.connect(now);
  auto output_hex = [&] {
    const auto [data, size] = service.output(id);
    std::string out = to_hex(data, size);
    service.sent(id, size, now);
    return out;
  };

  const Bytes hello = bytes_of_hex(
      "3d000000445053540210000000000102030405060708090a0b0c0d0e0f20000000"
      "7720ef04b8b26625bd56f0affabb380d031b5e1663eb3659a921a61fe725cc7d");
  EXPECT_EQ(hello, wire::hello_frame(recorded_client_nonce(), hs::run_digest(kRecordedRun)));
  service.receive(id, hello.data(), hello.size(), now);
  EXPECT_EQ(output_hex(),
            "390000000010000000f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff20000000"
            "7826622d20ecfaf706fbfe98699b446d55bfdc94d7b103bb81e2057485fa786a");

  const Bytes proof = bytes_of_hex("2400000020000000d8ab724a2407601e4b50e77e7e2655d3d72132f42aeb46b9edd2b864b72fa9c3");
  service.receive(id, proof.data(), proof.size(), now);
  EXPECT_EQ(output_hex(), "0100000000");  // kOk: the client is in
  EXPECT_FALSE(service.done(id));
  EXPECT_EQ(service.strangers(), 0u);
}

}  // namespace
}  // namespace datapar::detail
