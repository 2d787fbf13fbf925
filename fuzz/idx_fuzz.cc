// Fuzz target: the IDX reader (MNIST-family files, gzip or plain). The first byte picks the
// dimensions (1 or 3) and a sample limit; the rest is the file. Any input must give a tensor
// or a datapar::Error, in bounded memory.
#include <ATen/ATen.h>

#include <cstdint>

#include "datapar/data/idx_file.h"
#include "datapar/error.h"
#include "memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static datapar::fuzz::MemoryFile file;
  const int ndims = (data[0] & 1) ? 3 : 1;
  const int64_t limit = (data[0] >> 1) & 7;  // 0: every sample
  const std::string path = file.hold(data + 1, size - 1);
  try {
    const at::Tensor t = datapar::read_idx_file(path, ndims, limit);
    if (t.dim() != ndims) __builtin_trap();
    if (limit > 0 && t.size(0) > limit) __builtin_trap();
  } catch (const datapar::Error&) {
  }
  return 0;
}
