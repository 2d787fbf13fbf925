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
#include "datapar/timeout.h"

namespace datapar::tools {

struct FtBenchJob {
  std::unique_ptr<ft::Decider> decider;
  std::unique_ptr<ft::ElasticGroup> elastic;

  FtBenchJob(ProcessGroup& group, const std::string& run) {
    ft::FtOptions options;
    options.expected_members = group.size();
    options.min_members = group.size();
    const std::shared_ptr<Store> store = default_store();
    if (group.rank() == 0) {
      std::shared_ptr<Store> own = store->clone(kDefaultTimeout);  // its calls must not queue behind ours
      decider = std::make_unique<ft::Decider>(own ? own : store, run, options);
    }
    elastic = std::make_unique<ft::ElasticGroup>(store, run, options,
                                                 [](std::shared_ptr<Store> epoch_store, int rank, int size) {
                                                   return new_gloo_process_group(std::move(epoch_store), rank, size);
                                                 });
  }
};

}  // namespace datapar::tools
