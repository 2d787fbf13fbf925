// Fuzz target: the TcpStore server's protocol (StoreService), driven as the poll loop drives
// it, over up to 8 connections and a fake clock. The input is a schedule of commands:
//   0              a new connection
//   1 S L b[L]     connection S receives L bytes (L < 256)
//   2 S Lo Hi b[L] connection S receives L = Lo + 256 Hi bytes
//   3 S N          N * 16 bytes of S's output are sent (N = 0: all of it)
//   4 S            S disconnects
//   5 T            the clock moves T * 50 ms on; deadlines expire
//   6 S            S sends a hello with the right token (through the real check)
//   7 S            S sends a hello with a wrong token
// (a command byte is taken modulo 8, S modulo the open connections). Like the loop, the
// driver reads no more than want() and closes what done() says. Whatever the schedule, the
// service must not crash, leak or grow past its limits.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "rendezvous/store_service.h"
#include "rendezvous/tcp_wire.h"

namespace {

using datapar::detail::StoreLimits;
using datapar::detail::StoreService;
using Clock = StoreService::Clock;

const char kToken[] = "fuzz-token";

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
  StoreService service(kToken, limits());
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
      const datapar::Bytes hello = datapar::detail::wire::hello_frame(command == 6 ? kToken : "fuzz-tokeN");
      if (id) deliver(*id, hello.data(), hello.size());
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
