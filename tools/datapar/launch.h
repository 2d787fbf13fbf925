// `datapar launch`: runs a program as the workers of a data-parallel job on this node, with
// torchrun's environment, and supervises them (launch.cc). Processes and their output are
// worker_group.h's; this layer decides the environment, when to stop and when to restart.
//
// Every worker gets, as torchrun gives:
//   RANK              node_rank * nproc_per_node + local_rank
//   LOCAL_RANK        0 .. nproc_per_node - 1
//   WORLD_SIZE        nnodes * nproc_per_node
//   LOCAL_WORLD_SIZE  nproc_per_node
//   GROUP_RANK        node_rank
//   MASTER_ADDR, MASTER_PORT   where rank 0 serves the TcpStore (init method env://); a port
//                              the launcher chose is kept for rank 0 until the job ends
//                              (datapar/rendezvous/reserved_port.h)
// and, datapar's own:
//   DATAPAR_STORE_TOKEN     the job's store token (TcpStore refuses other jobs' processes)
//   DATAPAR_RUN_ID          the job's identity (--run-id; random on one node): a store
//                           serves the processes of its own run only, so two jobs that meet
//                           on one port or file:// path never join each other
//   DATAPAR_RESTART_COUNT   0 on the first start, k after the k-th restart (torchrun's
//                           TORCHELASTIC_RESTART_COUNT): resume from a checkpoint if > 0
//   DATAPAR_MAX_RESTARTS    --max-restarts
//   OMP_NUM_THREADS=1       only if unset and nproc_per_node > 1 (as torchrun does), so N
//                           workers do not each start one thread per core
//
// The launcher forks the workers itself (worker_group.h); their Gloo groups move their
// collectives through shared memory within the machine (src/process_group/shm), over TCP
// between machines. It starts nothing else: a job on MPI is started with the user's own
// `mpirun -np N PROGRAM`, and a Slurm job with `srun`; datapar reads their variables
// (init_method.h), so neither needs this launcher.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "datapar/rendezvous/reserved_port.h"

namespace datapar::tools {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port on this node (single node only)
  // The port resolve_launch_options chose for master_port, kept from other processes until
  // the last copy of these options is gone (reserved_port.h): rank 0 of every attempt binds it.
  std::shared_ptr<const ReservedPort> master_port_reservation;
  // The store token shared by every worker of the job. Empty: read from token_file, else
  // DATAPAR_STORE_TOKEN from the launcher's environment, else (single node only) a fresh
  // random one. Workers get it in their environment, which only this user can read; a
  // --token on the command line is visible to every user in `ps`, so it draws a warning.
  std::string token;
  std::string token_file;
  bool token_on_command_line = false;  // --token was given: warn
  // The job's identity, the same on every node (torchrun's --rdzv-id). Empty:
  // DATAPAR_RUN_ID from the launcher's environment, else (single node) a fresh random one,
  // else (several nodes) none given: the workers use the token as the job's identity.
  std::string run_id;
  int max_restarts = 0;
  // --fault-tolerant: the job goes on when a worker fails (docs/fault_tolerance.md). The
  // launcher of node 0 serves the store and decides the membership (no worker does, so any
  // may die), a failed worker alone is restarted (up to max_restarts times each) while the
  // others go on, and the job stops below min_ranks. The program must be fault-tolerant
  // itself (`datapar train --fault-tolerant`); workers get JobConfig::fault_tolerance's variables.
  bool fault_tolerant = false;
  int min_ranks = 1;
  int max_ranks = 0;  // 0: nnodes * nproc_per_node
  std::chrono::milliseconds ft_timeout = std::chrono::seconds(5);  // a worker silent this long is evicted
  std::string cpu_bind = "cores";  // cores | none: forked workers each on their share of the cores
  // After the first failure or a forwarded signal, how long workers get to exit before
  // they are SIGKILLed.
  std::chrono::milliseconds grace_period = std::chrono::seconds(5);
  std::vector<std::string> program;  // argv of the worker program
  // How the launcher's messages begin, and whether each line a worker prints begins with
  // "[rank R] " (a tool that becomes its own job's launcher prints its table untagged).
  std::string who = "datapar launch";
  bool tag_output = true;
};

// Checks the options and resolves the defaults (free port, token, run id). Throws
// InvalidArgumentError naming the option for a bad value, a missing program or one that
// is not found or not executable, or a token file that cannot be read.
LaunchOptions resolve_launch_options(LaunchOptions options);

// The environment of one worker: the launcher's own, with the variables above set.
std::vector<std::string> worker_environment(const LaunchOptions& options, int local_rank, int restart_count);

// Runs the job to the end and returns the launcher's exit status: 0 when every worker
// exited 0; the failed worker's exit code (128 + signal if a signal ended it) once
// restarts are used up; 128 + signal when the launcher got SIGINT, SIGTERM or SIGHUP.
// --fault-tolerant: 0 when the workers that were not given up on finished with 0; 1 when
// the membership decider stopped the job (below --min-ranks).
// Prints one summary line to stderr for each failure and restart. Throws
// InvalidArgumentError as resolve_launch_options() does.
int launch(const LaunchOptions& options);

}  // namespace datapar::tools
