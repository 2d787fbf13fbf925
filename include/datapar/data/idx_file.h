// Reading IDX files, the format of MNIST and Fashion-MNIST, gzip-compressed or not.
//
// Format (all of it described here; docs/ has no copy): a header of big-endian uint32s,
//   magic    0x000008DD: two zero bytes, type 0x08 (unsigned byte), DD dimensions
//   dims     DD sizes, e.g. N, 28, 28 for images (magic 0x00000803) or N for labels (0x00000801)
// then prod(dims) unsigned bytes, row-major. The file must end exactly there.
//
// Only the unsigned-byte type (0x08) is read: it is the only one the MNIST family uses.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace datapar {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions (N, rows, cols)
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension (N)

// Reads `path` (gzip-compressed or plain: zlib detects the gzip magic 1f 8b and reads a
// plain file as it is) and returns a uint8 tensor of the header's dimensions.
// ndims: the number of dimensions expected (magic 0x00000800 + ndims).
// max_samples: 0 reads every sample; N > 0 reads only the first N (all if the file has
// fewer) and returns (min(N, count), ...). The file is streamed: memory and time follow
// what is read, and the bytes after it are neither read nor checked (a file truncated or
// too long past the first N samples reads without an error).
// Throws InvalidArgumentError when the file cannot be opened or max_samples < 0, and Error
// when it is not an IDX file with that magic, holds 0 samples, ends early, or (read whole)
// goes on past the data (each message names the file and the problem).
at::Tensor read_idx_file(const std::string& path, int ndims, int64_t max_samples = 0);

// The dimensions `path`'s header announces (the first: the sample count), checked as
// read_idx_file checks them (magic, size, at least one sample). Reads only the header.
std::vector<int64_t> read_idx_dims(const std::string& path, int ndims);

}  // namespace datapar
