// nccl_probe's collectives scenario: the backend conformance suite (testing/conformance.h)
// on an NCCL group, and what NCCL does beyond it, as googletest tests in the probe's process.
#pragma once

#include "datapar/process_group/process_group.h"

namespace datapar::testing {

// Runs the tests on `group` (nccl, every rank of the job calls it); their report goes to
// stdout. Returns 0 when all pass.
int nccl_collectives(ProcessGroup& group);

}  // namespace datapar::testing
