// Whether a collective of this process failed (a peer died, hung past the timeout, or the
// group broke): then the peers are known to be gone or stuck, and what would wait for all
// of them at exit (MPI_Finalize's fence, Note [Finalizing without a hung peer]) must not
// wait for them long.
#pragma once

namespace datapar::detail {

// Called where a Work fails or its wait times out. Thread-safe, cheap.
void note_collective_failure();

bool collective_failed();

}  // namespace datapar::detail
