// A worker of a job started by `datapar launch --fault-tolerant` (docs/fault_tolerance.md):
// its connection to the store the launcher serves and its membership, made as the launcher
// expects. The launcher decides the job's membership, restarts a worker that fails, and
// reports it dead at once (so the others go on without waiting for its heartbeat to stop).
//
//   ft::LaunchedJob job = ft::join_launched_job();
//   ft::FaultTolerantDdp<Net> trainer(model, sgd, *job.elastic, /*slices=*/job.world_size);
//
// The same in `datapar train --fault-tolerant` and examples/ft_ddp_fashion_mnist/.
#pragma once

#include <memory>

#include "datapar/ft/elastic_group.h"
#include "datapar/ft/membership/options.h"
#include "datapar/rendezvous/job_config.h"
#include "datapar/rendezvous/store.h"

namespace datapar::ft {

struct LaunchedJob {
  std::shared_ptr<Store> store;            // the job's store (served by node 0's launcher)
  std::unique_ptr<ElasticGroup> elastic;   // this worker's membership and its epochs' groups
  FtOptions options;                       // the membership options, as the launcher's decider has them
  int world_size = 0;                      // the job's full size: every worker of every node
};

// Connects to the launcher's store and makes this worker's member, each membership epoch's
// group a gloo group made as init_process_group makes one for this job (its address, its use
// of shared memory), with launched_group_timeout. Names the member to the launcher
// (launched_worker_key). `replica_group_size` > 1: the job's members come in replica groups
// of that many consecutive ranks (HSDP's shard groups, FtOptions::replica_group_size), this
// worker in the slot of its launcher's RANK, which a restarted worker keeps. Throws
// InvalidArgumentError, saying what to do, when this process was not started by
// `datapar launch --fault-tolerant`, and what TcpStore throws when the store does not answer.
LaunchedJob join_launched_job(const JobConfig& config = resolve_job_config(), int replica_group_size = 1);

}  // namespace datapar::ft
