// One fault-tolerant job inside a bench (datapar bench ddp / fsdp --fault-tolerant): its
// membership decider (on rank 0; in a job, the launcher hosts it) and its members' group,
// over the bench's default group's store. Each job its own run name: two trainers sharing
// one ElasticGroup would each join a new epoch under the other.
#pragma once

#include <memory>
#include <string>

#include "datapar/distributed.h"
#include "datapar/ft/membership/decider.h"
#include "datapar/ft/elastic_group.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/job_config.h"
#include "datapar/timeout.h"

namespace datapar::tools {

struct FtBenchJob {
  std::unique_ptr<ft::Decider> decider;
  std::unique_ptr<ft::ElasticGroup> elastic;

  // `replica_group_size` > 1: members in replica groups of that many consecutive ranks (HSDP).
  FtBenchJob(ProcessGroup& group, const std::string& run, int replica_group_size = 1) {
    ft::FtOptions options;
    options.expected_members = group.size();
    options.min_members = group.size();
    options.replica_group_size = replica_group_size;
    ft::ReplicaSlot slot;
    if (replica_group_size > 1) slot = {group.rank() / replica_group_size, group.rank() % replica_group_size};
    const std::shared_ptr<Store> store = default_store();
    if (group.rank() == 0) {
      std::shared_ptr<Store> own = store->clone(kDefaultTimeout);  // its calls must not queue behind ours
      decider = std::make_unique<ft::Decider>(own ? own : store, run, options);
    }
    // The job's address, as its default group's (DATAPAR_GLOO_HOSTNAME on two hosts).
    const GlooOptions gloo = gloo_job_options(resolve_job_config());
    elastic = std::make_unique<ft::ElasticGroup>(store, run, options,
                                                 [gloo](std::shared_ptr<Store> epoch_store, int rank, int size) {
                                                   return new_gloo_process_group(std::move(epoch_store), rank, size,
                                                                                 gloo);
                                                 },
                                                 slot);
  }
};

}  // namespace datapar::tools
