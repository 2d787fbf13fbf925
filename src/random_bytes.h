// Bytes from the kernel's random source (getrandom), for what must not be guessed: store
// tokens, the names of temporary files, the store handshake's nonces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace datapar::detail {

// Fills out[0, n) with random bytes. False (errno set) if the kernel could not give them.
bool fill_random(uint8_t* out, size_t n);

// `n` random bytes as 2n lowercase hex digits; "" (errno set) if the kernel could not give them.
std::string random_hex(size_t n);

// The bytes as lowercase hex digits.
std::string to_hex(const uint8_t* data, size_t n);

}  // namespace datapar::detail
