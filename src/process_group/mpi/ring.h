// Ring all-reduce over MPI point-to-point messages, the MPI backend's path for large
// buffers between machines (Note [Ring all-reduce] in ring.cc); within one machine they go
// through shared memory (shm_collectives.h). Small buffers take MPI_Iallreduce.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "datapar/process_group/process_group.h"
#include "process_group/mpi/runtime.h"

namespace datapar::detail::mpi {

// Buffers from this size (bytes) on take the ring or shared memory.
constexpr int64_t kRingMinBytes = 256 << 10;

class Ring {
 public:
  // `comm`: a communicator the ring uses for nothing else (its messages all have tag 0).
  explicit Ring(MPI_Comm comm);

  // All-reduces `buffer` (contiguous, float32/64 or int32/64) in place with `op` (kAvg:
  // the sum; the caller divides). Returns false when `deadline` passed first: messages
  // are then left posted, and the caller must keep `buffer` and scratch() alive and stop
  // using the communicator. Throws CommError on an MPI error. Runs on one thread at a time.
  bool all_reduce(at::Tensor& buffer, ReduceOp op, Clock::time_point deadline, const std::string& what);

  // The receive buffer reused between calls.
  const at::Tensor& scratch() const { return scratch_; }

 private:
  // Sends part `send` of `buffer` to the next rank and receives part `receive` from the
  // previous one: reduced into place (reduce-scatter) or copied into place (all-gather).
  bool exchange(at::Tensor& buffer, int send, int receive, bool reduce, ReduceOp op, Clock::time_point deadline,
                const std::string& what);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  at::Tensor scratch_;  // (2 * segment,) elements: two segments in flight
};

}  // namespace datapar::detail::mpi
