// IDX reading through zlib. See idx_file.h for the format.
//
// gzopen/gzread read both compressed and plain files (zlib's "transparent" mode), so one
// path serves both. A gzip stream cut short shows up as a short read plus a zlib error
// ("unexpected end of file"); a stream that is complete but holds too few bytes is a short
// read without one. Both are reported as the file ending early, with the byte counts.
#include "datapar/data/idx_file.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <vector>

#include "datapar/error.h"

namespace datapar {
namespace {

// Sanity limit on the data a header may announce (the full MNIST train set is 47 MB).
constexpr int64_t kMaxIdxBytes = int64_t{1} << 34;

std::string hex32(uint32_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(8) << std::setfill('0') << value;
  return out.str();
}

// Owns a gzFile; closes it on every path out.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    DATAPAR_CHECK(file_ != nullptr, path, ": cannot open (", errno ? std::strerror(errno) : "out of memory",
                  "). Check the path, or point the dataset root at the directory with the IDX files.");
    gzbuffer(file_, 1 << 17);  // fewer system calls than the 8 KiB default
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `size` bytes into `out`; returns how many arrived. Throws Error on a zlib
  // error other than the stream ending early.
  int64_t read(void* out, int64_t size) {
    int64_t done = 0;
    while (done < size) {
      const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(size - done, INT_MAX / 2));
      const int got = gzread(file_, static_cast<char*>(out) + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_, &code);
        throw Error(detail::str_cat(path_, ": corrupt gzip data after ", done, " bytes (zlib: ", message,
                                    "). Download the file again."));
      }
      if (got == 0) break;
      done += got;
    }
    return done;
  }

  // zlib's note on why the last read stopped short, or "" at a clean end of stream.
  std::string end_note() {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    return code == Z_OK ? std::string() : detail::str_cat("; zlib: ", message);
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t big_endian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Reads and checks the magic number and the dimensions, leaving `reader` at the data.
std::vector<int64_t> read_header(GzReader& reader, const std::string& path, int ndims) {
  DATAPAR_CHECK(ndims >= 1 && ndims <= 255, "read_idx_file: ndims is ", ndims, "; IDX files have 1 to 255 dimensions.");
  const uint32_t want_magic = 0x00000800u + static_cast<uint32_t>(ndims);

  unsigned char magic_bytes[4];
  const int64_t got_magic = reader.read(magic_bytes, 4);
  if (got_magic < 4) {
    throw Error(detail::str_cat(path, ": ", got_magic == 0 ? "empty" : "shorter than an IDX header",
                                " (", got_magic, " bytes", reader.end_note(), "; truncated file?)."));
  }
  const uint32_t magic = big_endian(magic_bytes);
  if (magic != want_magic) {
    throw Error(detail::str_cat(path, ": magic number is ", hex32(magic), ", expected ", hex32(want_magic),
                                " (an IDX file of unsigned bytes with ", ndims, " dimension", ndims == 1 ? "" : "s",
                                "). Is it the right file (images vs labels), and complete?"));
  }

  std::vector<unsigned char> header(4 * static_cast<size_t>(ndims));
  const int64_t got_header = reader.read(header.data(), static_cast<int64_t>(header.size()));
  if (got_header < static_cast<int64_t>(header.size())) {
    throw Error(detail::str_cat(path, ": the header ends early (", 4 + got_header, " of ", 4 + header.size(),
                                " bytes", reader.end_note(), "; truncated file?)."));
  }
  std::vector<int64_t> dims(ndims);
  int64_t payload = 1;
  for (int d = 0; d < ndims; ++d) {
    dims[d] = big_endian(&header[4 * d]);
    if (dims[d] > 0 && payload > kMaxIdxBytes / dims[d]) {
      throw Error(detail::str_cat(path, ": the header announces more than ", kMaxIdxBytes,
                                  " bytes of data; the file is corrupt."));
    }
    payload *= dims[d];
  }
  // An empty split trains to a loss of nan and tests nothing.
  if (dims[0] == 0) {
    throw Error(detail::str_cat(path, ": holds 0 samples (its header says so); a dataset needs at least one. Is it the ",
                                "right file, and complete?"));
  }
  return dims;
}

// Reads `wanted` bytes into *out, shaped `dims`, and returns how many arrived. Memory
// follows the bytes that arrive, not the header: 24 bytes of header can announce 16 GiB, so
// past kReadChunk the data is read in chunks and joined only once it is all there.
constexpr int64_t kReadChunk = int64_t{64} << 20;

int64_t read_growing(GzReader& reader, const std::vector<int64_t>& dims, int64_t wanted, at::Tensor* out) {
  const auto bytes = at::TensorOptions(at::kByte);
  if (wanted <= kReadChunk) {
    *out = at::empty(dims, bytes);
    return reader.read(out->data_ptr<uint8_t>(), wanted);
  }
  std::vector<at::Tensor> chunks;
  int64_t got = 0;
  while (got < wanted) {
    at::Tensor chunk = at::empty({std::min(kReadChunk, wanted - got)}, bytes);
    const int64_t n = reader.read(chunk.data_ptr<uint8_t>(), chunk.numel());
    got += n;
    if (n < chunk.numel()) return got;  // ends early: the caller reports it
    chunks.push_back(std::move(chunk));
  }
  *out = at::cat(chunks).view(dims);
  return got;
}

}  // namespace

std::vector<int64_t> read_idx_dims(const std::string& path, int ndims) {
  GzReader reader(path);
  return read_header(reader, path, ndims);
}

at::Tensor read_idx_file(const std::string& path, int ndims, int64_t max_samples) {
  DATAPAR_CHECK(max_samples >= 0, "read_idx_file: max_samples is ", max_samples,
                "; use 0 (every sample) or a positive count.");
  GzReader reader(path);
  const std::vector<int64_t> dims = read_header(reader, path, ndims);
  const int64_t header_bytes = 4 + 4 * static_cast<int64_t>(ndims);
  int64_t sample_bytes = 1;
  for (int d = 1; d < ndims; ++d) sample_bytes *= dims[d];
  const int64_t payload = dims[0] * sample_bytes;

  // Only the samples asked for are read, straight into the result: memory follows the
  // limit, not the file (a few hundred KB of gzip can hold GBs of pixels).
  const bool limited = max_samples > 0 && max_samples < dims[0];
  std::vector<int64_t> out_dims = dims;
  if (limited) out_dims[0] = max_samples;
  const int64_t wanted = out_dims[0] * sample_bytes;
  at::Tensor out;
  const int64_t got = read_growing(reader, out_dims, wanted, &out);
  if (got < wanted) {
    throw Error(detail::str_cat(path, ": ends early: ", header_bytes + got, " of ", header_bytes + wanted,
                                " bytes (the header announces ", dims[0], " samples",
                                limited ? detail::str_cat(", of which the first ", max_samples, " are read") : "",
                                reader.end_note(), "; truncated file?)."));
  }
  if (limited) return out;  // the rest is not read, so not checked
  unsigned char extra = 0;
  if (reader.read(&extra, 1) != 0) {
    throw Error(detail::str_cat(path, ": goes on past the ", header_bytes + payload,
                                " bytes its header announces (", dims[0],
                                " samples). Is the header's count wrong, or two files joined?"));
  }
  return out;
}

}  // namespace datapar
