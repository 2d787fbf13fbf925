// Linked into every program of a DATAPAR_SANITIZE=address build (cmake/datapar_sanitize.cmake).
//
// LeakSanitizer cannot judge processes that ran Open MPI: MPI_Init allocates blocks that Open
// MPI never frees, and MPI_Finalize unloads the components (dlclose) that allocated many of
// them, so their stacks show only "<unknown module>" and no suppression can name them. Leak
// checking is therefore off in a process mpirun started (OMPI_COMM_WORLD_SIZE is set); every
// other process, and every other AddressSanitizer check in these, stays on. The hook must be
// in the executable: the sanitizer's runtime, linked into it, holds the default.
#include <cstdlib>

extern "C" int __lsan_is_turned_off() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ? 1 : 0; }
