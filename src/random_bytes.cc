// See random_bytes.h.
#include "random_bytes.h"

#include <sys/random.h>

#include <cerrno>
#include <vector>

namespace datapar::detail {

bool fill_random(uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

std::string to_hex(const uint8_t* data, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) out += hex[data[i] >> 4], out += hex[data[i] & 15];
  return out;
}

std::string random_hex(size_t n) {
  std::vector<uint8_t> bytes(n);
  return fill_random(bytes.data(), n) ? to_hex(bytes.data(), n) : std::string();
}

}  // namespace datapar::detail
