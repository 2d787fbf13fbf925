// The default process group, as torch.distributed keeps one per process.
//
//   datapar::init_process_group("gloo");                      // env:// and the launcher's RANK/WORLD_SIZE
//   datapar::init_process_group("gloo", "tcp://10.0.0.1:29500", rank, world_size);
//   auto group = datapar::default_group();
//   group->all_reduce(grads)->wait();
//   auto evens = datapar::new_group({0, 2});                  // nullptr on the other ranks
//   datapar::destroy_process_group();
//
// Not thread-safe: initialise and destroy from one thread. The groups themselves are
// thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar {

constexpr std::chrono::milliseconds kDefaultProcessGroupTimeout = std::chrono::minutes(30);

// Joins the job (see rendezvous() in rendezvous/init_method.h) and builds the default
// group on `backend`: "gloo" (CPU tensors). "nccl" and "mpi" are not part of this build yet
// and are refused with a clear error, as is any other name.
// rank / world_size < 0: from the launcher's environment.
// Throws InvalidArgumentError if a default group exists already, and whatever rendezvous()
// and the backend throw.
void init_process_group(const std::string& backend, const std::string& init_method = "env://", int rank = -1,
                        int world_size = -1, std::chrono::milliseconds timeout = kDefaultProcessGroupTimeout);

bool is_initialized();

// The default group. Throws InvalidArgumentError before init_process_group().
std::shared_ptr<ProcessGroup> default_group();
// The job's rendezvous store (for coordination beside the collectives, e.g. DDP's stall
// reports). Throws InvalidArgumentError before init_process_group.
std::shared_ptr<Store> default_store();
int get_rank();
int get_world_size();

// A group of the given ranks of the default group (their order gives the new ranks).
// Every process must call it, with the same ranks, in the same order as the others, as in
// PyTorch; processes outside `ranks` get nullptr. Throws InvalidArgumentError for a rank
// outside the job or listed twice.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);

// Releases the default group, the groups made by new_group (for this process's use
// through these functions) and the store. Groups still held elsewhere stay usable until
// released.
void destroy_process_group();

}  // namespace datapar
