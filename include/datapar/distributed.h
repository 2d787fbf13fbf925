// The default process group, as torch.distributed keeps one per process.
//
//   datapar::init_process_group("gloo");                      // env:// and the launcher's RANK/WORLD_SIZE
//   datapar::init_process_group("gloo", "tcp://10.0.0.1:29500", rank, world_size);
//   datapar::init_process_group("mpi");                       // under mpirun -np N
//   datapar::init_process_group();                            // default_backend(): what the launcher chose
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
#include "datapar/rendezvous/job_config.h"
#include "datapar/timeout.h"

namespace datapar {

// Joins the job and builds the default group on `backend`:
//   "gloo"  CPU tensors over TCP. The processes meet through `init_method` (see
//           rendezvous() in rendezvous/init_method.h); rank / world_size < 0: from the
//           launcher's environment.
//   "mpi"   CPU tensors through MPI (shared memory within a machine), in builds with MPI
//           (DATAPAR_HAVE_MPI). Start the processes with mpirun; as in PyTorch, MPI gives
//           rank and world size and init_method is ignored. Given rank / world_size must
//           match MPI's (InvalidArgumentError otherwise). Rank 0 serves the job's store
//           (default_store()) on a free port and tells the others where through MPI: at
//           MASTER_ADDR if set, else loopback when every process runs on this machine,
//           else this machine's hostname.
//   "nccl"  CUDA tensors on this process's GPU (cuda:LOCAL_RANK; see
//           datapar/process_group/nccl.h), in builds against a CUDA libtorch
//           (DATAPAR_HAVE_NCCL). The processes meet through `init_method`, as for gloo.
//   ""      default_backend().
// A backend this build lacks and unknown names are refused with a clear error.
// Throws InvalidArgumentError if a default group exists already, and whatever rendezvous()
// and the backend throw.
// The environment is read once, here (resolve_job_config()), and what it says is passed to
// the rendezvous, the store and every group of the job (new_group too): DATAPAR_SHM,
// DATAPAR_MPI_SHM, DATAPAR_GLOO_HOSTNAME, LOCAL_RANK and the rest (docs/launching.md,
// "Environment variables"). The overload with `config` reads no environment.
void init_process_group(const std::string& backend = "", const std::string& init_method = "env://", int rank = -1,
                        int world_size = -1, std::chrono::milliseconds timeout = kDefaultTimeout);
void init_process_group(const std::string& backend, const std::string& init_method, int rank, int world_size,
                        std::chrono::milliseconds timeout, const JobConfig& config);

// The backend for a program that names none: $DATAPAR_BACKEND if the user set it (not
// empty; `datapar launch` sets no backend), else "mpi" in a process mpirun started
// (OMPI_COMM_WORLD_SIZE or PMI_SIZE set) of a build with MPI, else "gloo". CPU tensors;
// name "nccl" for CUDA. The first form reads the environment (resolve_job_config()), the
// second reads `config`.
std::string default_backend();
std::string default_backend(const JobConfig& config);

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
// released. Call it before the process ends: it waits for the other ranks first. A default
// group still there at exit is released then without that wait, before the CUDA runtime
// unloads (an NCCL group torn down after it crashed the process).
void destroy_process_group();

}  // namespace datapar
