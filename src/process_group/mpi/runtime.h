// The MPI library as datapar uses it: initialised once per process with
// MPI_THREAD_MULTIPLE, finalised at exit when datapar initialised it, and requests waited
// for by polling, so that every wait ends by a deadline.
//
// Not a process group (see process_group.cc); only this file and process_group.cc include
// <mpi.h>. Every MPI call an operation makes happens under an MpiUse guard, so that
// MPI_Finalize at exit never runs under an operation in flight.
#pragma once

// MPI's C API only: without these, <mpi.h> in C++ pulls in the deprecated C++ bindings,
// which need a library (libmpi_cxx) datapar does not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <string>

namespace datapar::detail::mpi {

using Clock = std::chrono::steady_clock;

// Initialises MPI unless it is (MPI_Init_thread, MPI_THREAD_MULTIPLE) and registers
// MPI_Finalize to run at exit. If the program initialised MPI itself, checks its thread
// level and leaves finalising to the program. Thread-safe; cheap after the first call.
// Throws CommError if MPI was finalised already, cannot be initialised, or gives less
// than MPI_THREAD_MULTIPLE.
void initialize();

// Held while an operation calls MPI. Throws CommError naming `what` once MPI is being
// finalised (the program is exiting); MPI_Finalize waits until no guard is held.
class MpiUse {
 public:
  explicit MpiUse(const std::string& what);
  ~MpiUse();
  MpiUse(const MpiUse&) = delete;
  MpiUse& operator=(const MpiUse&) = delete;
};

// Whether MPI was finalised (by us at exit, or by the program); MPI must not be called then.
bool finalized();

// Throws CommError "<what>: MPI error <code>: <MPI's text>. <hint>" unless code is MPI_SUCCESS.
void check(int code, const std::string& what);

// Throws CommError naming `what` once MPI is being finalised: a wait must give up then.
void throw_if_finalizing(const std::string& what);

// Calls `done` until it returns true, then returns true; returns false once `deadline`
// passes. Spins first, then yields the core, then naps: see Note [Polling] in runtime.cc.
// Throws CommError when MPI is being finalised.
bool poll_until(const std::function<bool()>& done, Clock::time_point deadline, const std::string& what);

// Polls `request` (MPI_Test, which also drives MPI's progress) until it completes, then
// returns true and fills `status` if given; returns false with the request still active
// once `deadline` passes. Spins first, then yields the core, then naps: see
// Note [Polling] in runtime.cc. Throws CommError on an MPI error or when MPI is being
// finalised. REQUIRES: an MpiUse held by the caller.
bool wait(MPI_Request& request, Clock::time_point deadline, const std::string& what, MPI_Status* status = nullptr);

// Records a group's timeout: MPI_Finalize at exit waits at most the longest one (plus a
// grace) for peers, Note [Finalizing without a hung peer] in runtime.cc.
void note_group_timeout(std::chrono::milliseconds timeout);

// Keeps `buffer` alive until the process ends: an abandoned (timed-out) request may still
// read or write it. It also means a peer failed: MPI_Finalize at exit waits less for it
// (Note [Finalizing without a hung peer] in runtime.cc).
void keep_alive(const at::Tensor& buffer);

// MPI's largest tag (MPI_TAG_UB, at least 32767).
int max_tag();

}  // namespace datapar::detail::mpi
