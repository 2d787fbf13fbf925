// A job's configuration from the environment, resolved once (DESIGN.md, rendezvous layer).
//
// The public entry points that start a job (init_process_group, rendezvous,
// default_backend) call resolve_job_config() once, or take a JobConfig, and pass what it
// says down as options: nothing below them (stores, process groups, backends) reads the
// environment. Tests and programs that configure a job some other way resolve one from
// their own Environment. docs/launching.md, "Environment variables", lists every variable.
//
// Launchers: datapar launch and torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
// Open MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE) or Slurm's srun
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE), first found in that order.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "datapar/environment.h"

namespace datapar {

// Where a process stands in its job.
struct ProcessIdentity {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;        // -1: unknown
  int local_world_size = -1;  // -1: unknown
  std::string source;         // which launcher's variables gave it ("torchrun", "Open MPI", "Slurm")
};

// Rank and world size from the launcher's variables, or nullopt when none are set.
// Throws InvalidArgumentError for values that are not integers.
std::optional<ProcessIdentity> identity_from_environment(const Environment& env = process_environment());

// What `datapar launch --fault-tolerant` tells each of its workers (docs/fault_tolerance.md);
// datapar/ft/membership/options.h derives the membership options from it.
struct FaultToleranceConfig {
  std::chrono::milliseconds timeout{0};  // DATAPAR_FT_TIMEOUT_MS (--ft-timeout): a silent member is evicted
  int min_ranks = 1;                     // DATAPAR_FT_MIN_RANKS (--min-ranks)
  int max_ranks = 1;                     // DATAPAR_FT_MAX_RANKS (--max-ranks, or the job's size)
  int node_rank = 0;                     // GROUP_RANK: the node whose launcher supervises this worker
};

struct JobConfig {
  // What the launcher's variables say (identity_from_environment); nullopt: none set.
  std::optional<ProcessIdentity> launcher;
  // Not empty when the launcher's variables are set but do not parse: the message identity()
  // throws where rank and world size are needed (a job that passes both never sees it).
  std::string launcher_error;
  // MASTER_ADDR, MASTER_PORT: rank 0's store for env://. MASTER_ADDR is also where rank 0
  // serves the store of an mpi job, and, for env://, what gloo's address follows.
  std::optional<std::string> master_addr;
  std::optional<std::string> master_port;
  // DATAPAR_STORE_TOKEN: the store token every process of the job shares; empty: none given
  // (TcpStoreOptions::token).
  std::string store_token;
  // DATAPAR_RUN_ID, else DATAPAR_STORE_TOKEN: a FileStore's run id (FileStoreOptions::run_id).
  std::string run_id;
  // DATAPAR_BACKEND: the backend default_backend() returns; empty: not chosen.
  std::string backend;
  // OMPI_COMM_WORLD_SIZE or PMI_SIZE is set: an MPI launcher (mpirun, or srun with PMI)
  // started this process.
  bool under_mpi_launcher = false;
  // DATAPAR_GLOO_HOSTNAME: the address other processes reach this one on (gloo); nullopt:
  // found from the init method (see init_process_group).
  std::optional<std::string> gloo_hostname;
  // DATAPAR_SHM=0: gloo groups make no shared-memory collectives (GlooOptions::shared_memory).
  bool gloo_shared_memory = true;
  // DATAPAR_MPI_SHM=0: mpi groups make none either (MpiOptions::shared_memory).
  bool mpi_shared_memory = true;
  // LOCAL_RANK, as set: the GPU of an nccl group (NcclOptions::local_rank).
  std::optional<std::string> local_rank;
  // DATAPAR_NCCL_END_PROCESS_ON_FAILURE=0: a failure found after wait() returned is thrown
  // by the next call, not the end of the process (NcclOptions::end_process_on_failure).
  bool nccl_end_process_on_failure = true;

  // DATAPAR_FAULT_TOLERANT=1: started by `datapar launch --fault-tolerant`, which serves the
  // store at MASTER_ADDR:MASTER_PORT and decides the job's membership.
  // Then `fault_tolerance` holds what it said (nullopt otherwise), and fault_tolerance_error
  // is not empty when its DATAPAR_FT_* variables are missing or do not parse.
  std::optional<FaultToleranceConfig> fault_tolerance;
  std::string fault_tolerance_error;

  // `launcher`. Throws InvalidArgumentError with launcher_error when that is not empty.
  std::optional<ProcessIdentity> identity() const;
  // What the fault-tolerant launcher said. Throws InvalidArgumentError when this process was
  // not started by one, or its variables do not parse.
  FaultToleranceConfig fault_tolerant_launcher() const;
};

// Reads every variable above once. Never throws: values that do not parse are kept for the
// step that needs them to say so (launcher_error, local_rank).
JobConfig resolve_job_config(const Environment& env = process_environment());

}  // namespace datapar
