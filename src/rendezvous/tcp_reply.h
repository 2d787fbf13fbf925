// The client's side of the TcpStore format: collecting a reply frame as its bytes arrive,
// and decoding it. Functions over bytes, so that a fuzzer (fuzz/store_client_fuzz.cc) can
// feed them anything a wrong port or a broken server might answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/tcp_wire.h"

namespace datapar::detail::wire {

// What a reply says. Which fields are set depends on the request and the status.
struct Reply {
  Status status = Status::kError;
  Bytes value;                    // kGet, kCompareSet; kHello: the server's nonce
  Bytes proof;                    // kHello: the server's proof
  int64_t number = 0;             // kAdd, kNumKeys
  bool flag = false;              // kCheck, kDelete
  std::vector<std::string> keys;  // kWait answered kTimeout: the keys still missing
  std::string message;            // kRefused, kError
};

// Decodes the body of the reply to `request` (Op::kHello, Op::kProof for the handshake's
// messages). nullopt when it
// is malformed: a status this request cannot get, or fields that do not decode exactly.
std::optional<Reply> decode_reply(Op request, const uint8_t* body, size_t size);

// Collects one frame from pieces. The announced length is checked as soon as its 4 bytes
// are in, before anything else is read, and the body grows as bytes arrive rather than
// to the announced length: a peer that announces 64 MiB and sends 10 bytes costs 10 bytes.
class FrameCollector {
 public:
  explicit FrameCollector(uint32_t max_body = kMaxFrameBytes) : max_body_(max_body) {}

  // Bytes still missing from this frame (read at most this many); 0 when complete or bad.
  size_t missing() const;
  // Takes bytes (at most missing()). Returns false, and bad() turns true, when the
  // announced length is 0 or over the limit.
  bool add(const uint8_t* data, size_t size);
  bool bad() const { return bad_; }
  bool complete() const { return !bad_ && header_got_ == 4 && body_.size() == length_; }
  const Bytes& body() const { return body_; }

 private:
  uint32_t max_body_;
  uint8_t header_[4] = {};
  size_t header_got_ = 0;
  uint32_t length_ = 0;
  Bytes body_;
  bool bad_ = false;
};

}  // namespace datapar::detail::wire
