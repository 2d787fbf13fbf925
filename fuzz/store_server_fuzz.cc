// Fuzz target: the TcpStore server's protocol (StoreService), driven as the poll loop drives
// it, over up to 8 connections and a fake clock. The input is a schedule of commands:
//   0              a new connection
//   1 S L b[L]     connection S receives L bytes (L < 256)
//   2 S Lo Hi b[L] connection S receives L = Lo + 256 Hi bytes
//   3 S N          N * 16 bytes of S's output are sent (N = 0: all of it)
//   4 S            S disconnects
//   5 T            the clock moves T * 50 ms on; deadlines expire
//   6 S            S completes the handshake with the right token (through the real checks:
//                  the server's nonces are fixed, so the driver can compute the proof)
//   7 S V          S fails it: V % 3 = 0 a proof with a wrong token, 1 a hello of another
//                  run, 2 a hello of protocol version 1 (the token in clear)
// (a command byte is taken modulo 8, S modulo the open connections). Like the loop, the
// driver reads no more than want() and closes what done() says. Whatever the schedule, the
// service must not crash, leak or grow past its limits.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "rendezvous/store_handshake.h"
#include "rendezvous/store_service.h"
#include "rendezvous/tcp_wire.h"

namespace {

using datapar::detail::StoreLimits;
using datapar::detail::StoreService;
using Clock = StoreService::Clock;

namespace handshake = datapar::detail::handshake;
namespace wire = datapar::detail::wire;
using datapar::Bytes;

const char kToken[] = "fuzz-token";
const char kRun[] = "fuzz-run";
const Bytes kClientNonce(handshake::kNonceBytes, 0xc1);
const Bytes kServerNonce(handshake::kNonceBytes, 0x5e);

// The bytes of a client's whole handshake (Note [Handshake]), right or wrong as `variant` says.
Bytes handshake_bytes(int variant) {
  const Bytes run = handshake::run_digest(variant == 1 ? "another-run" : kRun);
  if (variant == 2) {  // protocol version 1: "DPST", 1, the token
    wire::Writer w;
    for (char m : wire::kMagic) w.u8(static_cast<uint8_t>(m));
    return w.u8(1).str(kToken).frame();
  }
  Bytes out = wire::hello_frame(kClientNonce, run);
  const Bytes proof = handshake::proof(variant == 0 ? "fuzz-tokeN" : kToken, handshake::Side::kClient, kClientNonce,
                                       kServerNonce, run);
  const Bytes second = wire::proof_frame(proof);
  out.insert(out.end(), second.begin(), second.end());
  return out;
}

// Small limits, so that short inputs reach eviction and output back-pressure.
StoreLimits limits() {
  StoreLimits l;
  l.hello_timeout = std::chrono::seconds(5);
  l.max_strangers = 3;
  l.max_output_bytes = 4096;
  return l;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  StoreService service(kToken, kRun, limits(), [] { return kServerNonce; });
  std::vector<StoreService::Id> open;
  auto now = Clock::time_point() + std::chrono::hours(1);
  size_t pos = 0;
  auto next = [&]() -> uint8_t { return pos < size ? data[pos++] : 0; };
  auto slot = [&]() -> StoreService::Id* {
    const uint8_t s = next();
    return open.empty() ? nullptr : &open[s % open.size()];
  };
  auto deliver = [&](StoreService::Id id, const uint8_t* bytes, size_t n) {
    // As the loop does: never more than the service wants.
    while (n > 0) {
      const size_t want = service.want(id);
      if (want == 0) break;
      const size_t take = want < n ? want : n;
      service.receive(id, bytes, take, now);
      bytes += take;
      n -= take;
    }
  };

  while (pos < size) {
    const uint8_t command = next() % 8;
    if (command == 0) {
      if (open.size() < 8) open.push_back(service.connect(now));
    } else if (command == 1 || command == 2) {
      StoreService::Id* id = slot();
      size_t n = next();
      if (command == 2) n += size_t{next()} << 8;
      if (n > size - pos) n = size - pos;
      if (id) deliver(*id, data + pos, n);
      pos += n;
    } else if (command == 3) {
      StoreService::Id* id = slot();
      const size_t n = size_t{next()} * 16;
      if (id) {
        const size_t queued = service.output(*id).second;
        service.sent(*id, n == 0 || n > queued ? queued : n, now);
      }
    } else if (command == 4) {
      if (StoreService::Id* id = slot()) service.disconnect(*id);
    } else if (command == 5) {
      now += std::chrono::milliseconds(50) * next();
      service.expire(now);
    } else {
      StoreService::Id* id = slot();
      const Bytes bytes = handshake_bytes(command == 6 ? 3 : next() % 3);
      if (id) deliver(*id, bytes.data(), bytes.size());
    }
    // The loop closes what the service is done with.
    for (size_t i = 0; i < open.size();) {
      if (service.done(open[i])) {
        service.disconnect(open[i]);
        open[i] = open.back();
        open.pop_back();
      } else {
        ++i;
      }
    }
    check(service.strangers() <= limits().max_strangers);
    check(service.connections() == open.size());
  }
  return 0;
}
