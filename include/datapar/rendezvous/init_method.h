// Rendezvous: how the processes of a job find each other before they form a process group.
//
// An init method is a URL, as in torch.distributed.init_process_group:
//   env://                 MASTER_ADDR and MASTER_PORT name rank 0's store server
//   tcp://host:port        rank 0 serves the store at host:port (use rank 0's address)
//   file:///shared/path    a FileStore on a filesystem every process can reach
// Rank and world size are given, or read from the launcher's environment: datapar launch
// and torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE) or Slurm's srun (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE), first found in that order.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "datapar/rendezvous/store.h"

namespace datapar {

struct InitMethod {
  enum class Kind { kEnv, kTcp, kFile };
  Kind kind = Kind::kEnv;
  std::string host;  // kTcp (and kEnv, once MASTER_ADDR is read)
  uint16_t port = 0;
  std::string path;  // kFile
};

// Parses an init method URL. Throws InvalidArgumentError for anything else, saying what
// a valid one looks like.
InitMethod parse_init_method(const std::string& url);

// Where a process stands in its job.
struct ProcessIdentity {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;        // -1: unknown
  int local_world_size = -1;  // -1: unknown
  std::string source;         // which launcher's variables gave it ("torchrun", "Open MPI", "Slurm")
};

// Looks a variable up; the default reads the process environment (tests pass their own).
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment process_environment();

// Rank and world size from the launcher's variables, or nullopt when none are set.
// Throws InvalidArgumentError for values that are not integers.
std::optional<ProcessIdentity> identity_from_environment(const Environment& env = process_environment());

// The store every process of the job shares, and this process's place in the job.
struct Rendezvous {
  std::shared_ptr<Store> store;
  int rank = -1;
  int world_size = -1;
};

// Joins the job: makes the store (rank 0 hosts the TCP server, with the token in
// DATAPAR_STORE_TOKEN, or one generated for a job on one machine), checks that the rank lies
// in [0, world_size), that no other process claims the same rank and that every process
// agrees on the world size, and waits until all world_size processes have joined.
// rank / world_size < 0: from identity_from_environment(). Throws InvalidArgumentError
// for a bad URL, rank or world size, a rank claimed twice, world sizes that disagree, a
// file:// directory that does not exist or a file that is not a store, a port in use, or
// a job across machines without DATAPAR_STORE_TOKEN; TimeoutError naming the ranks
// that never arrived, or when rank 0's server does not answer within the timeout.
Rendezvous rendezvous(const std::string& init_method, int rank = -1, int world_size = -1,
                      std::chrono::milliseconds timeout = kDefaultStoreTimeout,
                      const Environment& env = process_environment());

}  // namespace datapar
