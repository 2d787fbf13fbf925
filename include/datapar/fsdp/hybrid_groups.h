// The two groups of hybrid sharding (HSDP, FsdpOptions::replicate_group): a job of
// world_size ranks laid out as world_size / shard_size machines of shard_size consecutive
// ranks (as launchers number them). Each rank shards over its machine's ranks and replicates
// across the ranks at its place on every machine, as PyTorch's 2-D mesh (replicate, shard).
//
//   const datapar::HybridGroups groups = datapar::hybrid_groups();  // shard size: the machine's ranks
//   datapar::FsdpOptions options;
//   options.replicate_group = groups.replicate;
//   datapar::fully_shard_each<torch::nn::LinearImpl>(*model, groups.shard, options);
//   datapar::FullyShardedDataParallel fsdp(model, groups.shard, options);
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar {

struct HybridGroups {
  std::shared_ptr<ProcessGroup> shard;      // this rank's machine: ranks [m * shard_size, (m + 1) * shard_size)
  std::shared_ptr<ProcessGroup> replicate;  // the ranks with this one's place on every machine
};

// Makes the group of `ranks` (ranks of the job, in order), or nullptr on a rank outside them.
using MakeGroup = std::function<std::shared_ptr<ProcessGroup>(const std::vector<int>& ranks)>;

// This rank's groups, made by `make` for every group of the layout in one order (the shard
// groups, then the replicate groups), as new_group needs every rank to call it alike.
// Throws InvalidArgumentError when shard_size does not divide world_size.
HybridGroups hybrid_groups(int rank, int world_size, int shard_size, const MakeGroup& make);

// Over the default group (init_process_group), with new_group: collective. `shard_size` 0:
// the launcher's local world size (LOCAL_WORLD_SIZE: the ranks of one machine).
HybridGroups hybrid_groups(int shard_size = 0);

}  // namespace datapar
