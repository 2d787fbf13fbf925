// All-reduce through one shared-memory region mapped by every process of a group, when
// they all run on one machine: the MPI backend's path for large buffers there (Note
// [Shared-memory all-reduce] in shm_all_reduce.cc). Between machines the ring takes them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "datapar/process_group/process_group.h"
#include "process_group/mpi/runtime.h"

namespace datapar::detail::mpi {

// Bytes of a buffer reduced per round: each process's slot holds one round's data.
constexpr int64_t kShmRoundBytes = 2 << 20;

class ShmAllReduce {
 public:
  // Collective over `comm` (every member calls it): maps one region that every member
  // shares, or returns nullptr on every member when that is impossible (members on
  // different machines or mount namespaces, /dev/shm missing or full) or not wanted
  // ($DATAPAR_MPI_SHM=0 on any member). The region has no name once this returns, so
  // nothing is left in /dev/shm whatever happens to the processes. Throws TimeoutError
  // when the members do not all take part by `deadline`. REQUIRES: an MpiUse held.
  static std::unique_ptr<ShmAllReduce> create(MPI_Comm comm, Clock::time_point deadline, const std::string& what);

  ~ShmAllReduce();  // unmaps the region; local, never waits for the other members
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // All-reduces `buffer` (contiguous, 1-d, float32/64 or int32/64) in place with `op`
  // (kAvg: the sum; the caller divides). Every member gets bit-identical results. Returns
  // false when `deadline` passed first; this object is then unusable, as is the group.
  // Runs on one thread at a time.
  bool all_reduce(at::Tensor& buffer, ReduceOp op, Clock::time_point deadline, const std::string& what);

 private:
  struct Flags;
  ShmAllReduce(void* base, size_t bytes, int rank, int size);
  Flags& flags(int rank) const;
  char* slot(int rank, int set) const;
  // Raises this member's counter `which` (kArrived or kDone) to `generation` and wakes
  // the members sleeping on it.
  void reach(int which, uint32_t generation);
  // Waits until every member's counter `which` reached `generation`: false at `deadline`.
  bool all_reached(int which, uint32_t generation, Clock::time_point deadline, const std::string& what) const;

  void* base_;
  size_t bytes_;
  int rank_;
  int size_;
  uint32_t generation_ = 0;  // rounds done (modulo 2^32); the same on every member
};

}  // namespace datapar::detail::mpi
