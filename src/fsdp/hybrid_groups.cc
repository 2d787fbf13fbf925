// See datapar/fsdp/hybrid_groups.h.
#include "datapar/fsdp/hybrid_groups.h"

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/rendezvous/job_config.h"

namespace datapar {

HybridGroups hybrid_groups(int rank, int world_size, int shard_size, const MakeGroup& make) {
  DATAPAR_CHECK(shard_size >= 1 && world_size % shard_size == 0, "hybrid_groups: a shard size of ", shard_size,
                " does not divide the job's ", world_size, " ranks into machines.\n---> HINT: give the ranks of one ",
                "machine (datapar launch --nproc-per-node), or a divisor of ", world_size, ".");
  DATAPAR_CHECK(rank >= 0 && rank < world_size, "hybrid_groups: rank ", rank, " is outside the job's [0, ",
                world_size, ").");
  const int machines = world_size / shard_size;
  HybridGroups groups;
  for (int m = 0; m < machines; ++m) {
    std::vector<int> ranks;
    for (int i = 0; i < shard_size; ++i) ranks.push_back(m * shard_size + i);
    if (auto group = make(ranks)) groups.shard = std::move(group);
  }
  for (int i = 0; i < shard_size; ++i) {
    std::vector<int> ranks;
    for (int m = 0; m < machines; ++m) ranks.push_back(m * shard_size + i);
    if (auto group = make(ranks)) groups.replicate = std::move(group);
  }
  DATAPAR_INTERNAL_ASSERT(groups.shard && groups.replicate, "hybrid_groups: rank ", rank, " is in no group");
  return groups;
}

HybridGroups hybrid_groups(int shard_size) {
  if (shard_size == 0) {
    const std::optional<ProcessIdentity> identity = resolve_job_config().identity();
    shard_size = identity ? identity->local_world_size : -1;
    DATAPAR_CHECK(shard_size >= 1, "hybrid_groups: no shard size was given and the launcher did not say how many ",
                  "ranks a machine has (LOCAL_WORLD_SIZE).\n---> HINT: pass the shard size (the ranks of one machine).");
  }
  return hybrid_groups(get_rank(), get_world_size(), shard_size,
                       [](const std::vector<int>& ranks) { return new_group(ranks); });
}

}  // namespace datapar
