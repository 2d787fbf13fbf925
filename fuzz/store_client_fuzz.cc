// Fuzz target: the TcpStore client's reading of replies (tcp_reply.h), as the client does it:
// frames collected from pieces, then decoded as the reply to the request it sent. The
// input is a session: a byte that picks the request, then the server's bytes for its
// reply, again and again. They arrive in pieces of varying size, as over TCP. Whatever a
// wrong port or a broken server sends, reading must not crash, and must cost memory in
// proportion to the bytes received, not to the lengths announced.
#include <cstdint>
#include <cstdlib>

#include "rendezvous/tcp_reply.h"
#include "rendezvous/tcp_wire.h"

namespace {

using datapar::detail::wire::FrameCollector;
using datapar::detail::wire::Op;
using datapar::detail::wire::Status;

constexpr Op kRequests[] = {Op::kHello, Op::kSet,   Op::kGet,    Op::kAdd,     Op::kCompareSet,
                            Op::kWait,  Op::kCheck, Op::kDelete, Op::kNumKeys, Op::kProof};

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  size_t piece = 1;
  while (pos < size) {
    const Op request = kRequests[data[pos++] % (sizeof(kRequests) / sizeof(kRequests[0]))];
    FrameCollector frame(request == Op::kHello || request == Op::kProof ? datapar::detail::wire::kMaxHelloBytes
                                               : datapar::detail::wire::kMaxFrameBytes);
    while (!frame.complete() && !frame.bad() && pos < size) {
      piece = piece * 5 % 61 + 1;  // 1 .. 61 bytes, in no simple pattern
      size_t n = frame.missing();
      if (n > piece) n = piece;
      if (n > size - pos) n = size - pos;
      frame.add(data + pos, n);
      pos += n;
      check(frame.body().size() <= size);  // grown by what arrived, never by what was announced
    }
    if (!frame.complete()) return 0;  // a bad length, or the stream ended: the client gives up
    const auto reply = datapar::detail::wire::decode_reply(request, frame.body().data(), frame.body().size());
    if (!reply) return 0;  // malformed: the client closes the connection
    // What a reply may carry is what the request can get.
    check(reply->status != Status::kRefused || request == Op::kHello || request == Op::kProof);
    check(reply->status != Status::kNotFound || request == Op::kGet);
    check(reply->status != Status::kTimeout || request == Op::kWait);
    check(reply->keys.size() <= frame.body().size() / 4);
    check(reply->value.size() < frame.body().size());
  }
  return 0;
}
