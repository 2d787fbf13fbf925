// Fuzz target: the .metadata reader of torch.distributed.checkpoint (src/dcp/metadata.h),
// the pickle machine with DCP's classes plus the checks of the metadata. Any input must end
// in a Metadata or a CheckpointError, within the reader's budgets; anything else is a finding.
#include <cstdint>

#include "datapar/error.h"
#include "dcp/metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    datapar::dcp::detail::parse_metadata(reinterpret_cast<const char*>(data), size);
  } catch (const datapar::CheckpointError&) {
  }
  return 0;
}
