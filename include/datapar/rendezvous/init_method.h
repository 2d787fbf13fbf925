// Rendezvous: how the processes of a job find each other before they form a process group.
//
// An init method is a URL, as in torch.distributed.init_process_group:
//   env://                 MASTER_ADDR and MASTER_PORT name rank 0's store server
//   tcp://host:port        rank 0 serves the store at host:port (use rank 0's address)
//   file:///shared/path    a FileStore on a filesystem every process can reach
// Rank and world size are given, or read from the launcher's environment (JobConfig, in
// rendezvous/job_config.h: datapar launch, torchrun, Open MPI's mpirun or Slurm's srun).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "datapar/environment.h"
#include "datapar/rendezvous/job_config.h"
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

// The store every process of the job shares, and this process's place in the job.
struct Rendezvous {
  std::shared_ptr<Store> store;
  int rank = -1;
  int world_size = -1;
};

// Joins the job: makes the store (rank 0 hosts the TCP server, with the token in
// DATAPAR_STORE_TOKEN, or one generated for a job on one machine; a FileStore with the run
// id of JobConfig::run_id), checks that the rank lies in [0, world_size), that no other
// process claims the same rank and that every process agrees on the world size, and waits
// until all world_size processes have joined. rank / world_size < 0: from the launcher's
// variables (JobConfig::identity()); env://: MASTER_ADDR and MASTER_PORT. Throws InvalidArgumentError
// for a bad URL, rank or world size, a rank claimed twice, world sizes that disagree, a
// file:// directory that does not exist or a file that is not a store, a port in use, or
// a job across machines without DATAPAR_STORE_TOKEN; TimeoutError naming the ranks
// that never arrived, or when rank 0's server does not answer within the timeout.
// The configuration comes from `config`, or is resolved from `env` once.
Rendezvous rendezvous(const std::string& init_method, int rank, int world_size, std::chrono::milliseconds timeout,
                      const JobConfig& config);
Rendezvous rendezvous(const std::string& init_method, int rank = -1, int world_size = -1,
                      std::chrono::milliseconds timeout = kDefaultTimeout,
                      const Environment& env = process_environment());

}  // namespace datapar
