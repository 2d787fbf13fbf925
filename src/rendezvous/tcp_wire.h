// The TcpStore wire format: framing, encoders and a bounds-checked decoder.
//
// Every message is a frame: a little-endian u32 body length, then the body; an empty body,
// or one longer than kMaxFrameBytes (kMaxHelloBytes for the hello), is refused and the
// connection closed, on the length alone. In a body, a string or byte
// value is a u32 length and the bytes; an integer is 8 bytes, little-endian, two's
// complement; a list is a u32 count and its items. docs/store_protocol.md describes the
// exchange:
//   1. The handshake (Note [Handshake] in store_handshake.h): the client's hello, the
//      server's answer and proof, the client's proof, the server's verdict. The token
//      itself is never sent.
//   2. Then request/reply pairs, one at a time per connection. A request is u8 op and its
//      fields; a reply is u8 status and its fields (see Op below).
// A frame that does not decode exactly (unknown op, short or trailing bytes) closes that
// connection; the server carries on serving everyone else.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "datapar/rendezvous/store.h"

namespace datapar::detail::wire {

constexpr char kMagic[4] = {'D', 'P', 'S', 'T'};
constexpr uint8_t kVersion = 2;  // 1: the token in clear, refused since
constexpr uint32_t kMaxFrameBytes = 64u << 20;
constexpr uint32_t kMaxTokenBytes = 256;
// Keys in one list (a wait or check): a frame of empty keys would otherwise cost 8 times
// its size in string objects.
constexpr uint32_t kMaxListItems = 1u << 20;
// The longest frame a stranger may send: version 1's hello (magic, version, token length,
// token), so that an old client is answered, not cut off; version 2's are shorter.
constexpr uint32_t kMaxHelloBytes = 4 + 1 + 4 + kMaxTokenBytes;

enum class Op : uint8_t {
  kHello = 0,       // not sent as an op: names the hello's reply in decode_reply()
  kProof = 9,       // not sent as an op either: names the reply to the client's proof
  kSet = 1,         // key, value                  -> kOk
  kGet = 2,         // key                         -> kOk value | kNotFound
  kAdd = 3,         // key, i64 delta              -> kOk i64 new value
  kCompareSet = 4,  // key, expected, desired      -> kOk value afterwards
  kWait = 5,        // list of keys, i64 ms        -> kOk | kTimeout list of missing keys
  kCheck = 6,       // list of keys                -> kOk u8 all exist
  kDelete = 7,      // key                         -> kOk u8 existed
  kNumKeys = 8,     // (nothing)                   -> kOk i64 count
};

enum class Status : uint8_t { kOk = 0, kRefused = 1, kNotFound = 2, kTimeout = 3, kError = 4 };

// Appends fields to a frame body.
class Writer {
 public:
  Writer& u8(uint8_t v) {
    body_.push_back(v);
    return *this;
  }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) body_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Writer& i64(int64_t v) {
    const uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) body_.push_back(static_cast<uint8_t>(u >> (8 * i)));
    return *this;
  }
  Writer& bytes(const uint8_t* data, size_t n) {
    // One allocation for the length and the bytes (and no GCC 12 -Wstringop-overflow false
    // positive, which a growth between the two set off).
    body_.reserve(body_.size() + 4 + n);
    u32(static_cast<uint32_t>(n));
    body_.insert(body_.end(), data, data + n);
    return *this;
  }
  Writer& bytes(const Bytes& b) { return bytes(b.data(), b.size()); }
  Writer& str(const std::string& s) { return bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  Writer& strs(const std::vector<std::string>& list) {
    u32(static_cast<uint32_t>(list.size()));
    for (const std::string& s : list) str(s);
    return *this;
  }

  // The frame: length prefix and body.
  Bytes frame() const {
    Bytes out;
    out.reserve(body_.size() + 4);
    const uint32_t n = static_cast<uint32_t>(body_.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
    out.insert(out.end(), body_.begin(), body_.end());
    return out;
  }

 private:
  Bytes body_;
};

// Reads fields from a frame body. Any read past the end sets !ok() and returns zero values,
// so a decoder reads everything and checks ok() (and done()) once at the end.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  bool ok() const { return ok_; }
  bool done() const { return ok_ && p_ == end_; }

  uint8_t u8() { return take(1) ? p_[-1] : 0; }
  uint32_t u32() {
    if (!take(4)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p_[-4 + i]) << (8 * i);
    return v;
  }
  int64_t i64() {
    if (!take(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[-8 + i]) << (8 * i);
    return static_cast<int64_t>(v);
  }
  Bytes bytes() {
    const uint32_t n = u32();
    if (!take(n)) return {};
    return Bytes(p_ - n, p_);
  }
  std::string str() {
    const Bytes b = bytes();
    return std::string(b.begin(), b.end());
  }
  std::vector<std::string> strs() {
    const uint32_t n = u32();
    std::vector<std::string> out;
    if (n > kMaxListItems) ok_ = false;
    for (uint32_t i = 0; i < n && ok_; ++i) out.push_back(str());
    return out;
  }

 private:
  bool take(size_t n) {
    if (!ok_ || static_cast<size_t>(end_ - p_) < n) {
      ok_ = false;
      return false;
    }
    p_ += n;
    return true;
  }

  const uint8_t* p_;
  const uint8_t* end_;
  bool ok_ = true;
};

// The client's hello (Note [Handshake]).
inline Bytes hello_frame(const Bytes& client_nonce, const Bytes& run_digest) {
  Writer w;
  for (char m : kMagic) w.u8(static_cast<uint8_t>(m));
  return w.u8(kVersion).bytes(client_nonce).bytes(run_digest).frame();
}

// The client's proof, the handshake's third message.
inline Bytes proof_frame(const Bytes& proof) { return Writer().bytes(proof).frame(); }

// The length prefix of a frame starting at data (at least 4 bytes).
inline uint32_t frame_length(const uint8_t* data) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(data[i]) << (8 * i);
  return n;
}

}  // namespace datapar::detail::wire
