// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the store's handshake (Note
// [Handshake] in rendezvous/store_handshake.h) and for run ids that must not be written in
// clear. Small inputs only: a few hundred bytes per call, where speed does not matter.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace datapar::detail {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, size_t size);
  Sha256& update(const std::string& s) { return update(s.data(), s.size()); }
  // The digest of everything given. The object is spent afterwards.
  Sha256Digest finish();

 private:
  void block(const uint8_t* p);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes given
};

Sha256Digest sha256(const std::string& data);

// HMAC-SHA-256 of `message` under `key`.
Sha256Digest hmac_sha256(const std::string& key, const std::string& message);

}  // namespace datapar::detail
