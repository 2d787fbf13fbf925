// Writing large IDX test files cheaply: a gzip file may hold several members one after
// the other (zlib reads them as one stream), so hundreds of MB of zero pixels cost one
// compressed chunk written many times, a few hundred KB on disk.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace datapar::testing {

// `data` as one gzip member.
inline std::string gzip_member(const std::string& data) {
  z_stream z{};
  deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, /*windowBits=*/15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// An IDX file at `path`, gzip-compressed, whose header announces `dims` (dims[0] samples)
// and which holds `samples` samples of zero bytes (dims[0] unless given).
inline void write_zero_idx_gz(const std::string& path, uint32_t magic, const std::vector<uint32_t>& dims,
                              int64_t samples = -1) {
  std::string header;
  auto put = [&header](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  put(magic);
  int64_t sample_bytes = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    put(dims[d]);
    if (d > 0) sample_bytes *= dims[d];
  }
  if (samples < 0) samples = dims[0];
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << gzip_member(header);
  const int64_t per_chunk = 1000;
  const std::string chunk = gzip_member(std::string(static_cast<size_t>(sample_bytes * per_chunk), '\0'));
  for (int64_t done = 0; done + per_chunk <= samples; done += per_chunk) out << chunk;
  if (samples % per_chunk != 0) out << gzip_member(std::string(static_cast<size_t>(sample_bytes * (samples % per_chunk)), '\0'));
}

}  // namespace datapar::testing
