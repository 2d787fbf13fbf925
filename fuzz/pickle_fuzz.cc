// Fuzz target: the pickle reader (data.pkl of a torch.save file). Any input must end in a
// value or a CheckpointError, within the reader's budgets; anything else (a crash, another
// exception, a leak, more than libFuzzer's memory limit) is a finding.
#include <ATen/ATen.h>

#include <cstdint>

#include "datapar/error.h"
#include "serialization/pickle_reader.h"

namespace {

// Storages as torch_load would give them, without an archive: zeros of the asked size, up
// to a small bound (the real loader checks the size against the record's).
at::Tensor load_storage(const std::string& key, at::ScalarType dtype, int64_t numel) {
  if (numel < 0 || numel > 4096) throw datapar::CheckpointError("storage " + key + " is larger than the fuzz bound");
  return at::zeros({numel}, at::TensorOptions().dtype(dtype));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    datapar::detail::read_pickle(reinterpret_cast<const char*>(data), size, load_storage);
  } catch (const datapar::CheckpointError&) {
  }
  return 0;
}
