// How FullyShardedDataParallel and its units shard (fully_shard.h,
// fully_sharded_data_parallel.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>

namespace datapar {

class ProcessGroup;

struct FsdpOptions {
  // Free a unit's gathered parameters after its forward and gather them again for its
  // backward (ZeRO-3); false: keep them until the end of backward (ZeRO-2-like: less
  // communication, more memory). The root's own parameters are never freed in between: they
  // are the first needed in backward, as in PyTorch's fully_shard.
  bool reshard_after_forward = true;
  // With reshard_after_forward: after a unit's forward keep its parameters sharded over this
  // smaller group instead (PyTorch's fully_shard(reshard_after_forward=m)): the ranks of the
  // unit's group that share a machine, m of them, m dividing the group's size, the same
  // group on each of them. Between forward and backward each rank holds 1/m of the unit's
  // parameters rather than 1/n, and backward gathers them within this group (fast links)
  // rather than over the whole group. Null: reshard to the unit's group.
  std::shared_ptr<ProcessGroup> reshard_after_forward_group;

  // Mixed precision. param_dtype: the dtype the parameters are gathered in and computed
  // with (at::kBFloat16, at::kHalf); the shards, what the optimizer steps, keep the
  // parameters' own dtype (fp32 masters). The root casts its floating-point tensor inputs to
  // it, as PyTorch's MixedPrecisionPolicy(cast_forward_inputs=True). Unset: no conversion.
  std::optional<at::ScalarType> param_dtype;
  // The dtype gradients are reduce-scattered in (default: param_dtype, or the parameters'
  // own); they are added to the shards' gradients in the shards' dtype.
  std::optional<at::ScalarType> reduce_dtype;
  // The dtype a unit's floating-point buffers (BatchNorm's running statistics) are kept in
  // while training, as FSDP1's MixedPrecision(buffer_dtype): BatchNorm computes in one dtype
  // on the CPU, so a bfloat16 model needs bfloat16 statistics there. Full state dicts hold the
  // buffers in their own dtype. Unset: unchanged.
  std::optional<at::ScalarType> buffer_dtype;

  // How many units' all-gathers run ahead of the unit computing, in forward (the next units
  // in the previous iteration's order) and in backward (the units before it): 0 gathers each
  // unit only when it runs; more hides more communication and holds more units gathered at
  // once (PyTorch's limit_all_gathers / forward and backward prefetch). Read from the root.
  int prefetch = 1;

  // As DdpOptions::average_by_samples: each rank's gradient weighs its share of the global
  // batch (dim 0 of forward's first tensor argument), so uneven batches average exactly.
  // Read from the root. Default: the mean over ranks, as PyTorch.
  bool average_by_samples = false;

  // Hybrid sharding (HSDP, PyTorch's HYBRID_SHARD): the ranks that hold the same shard as
  // this one in the other shard groups (the same local rank on every machine; hybrid_groups()
  // in datapar/fsdp/hybrid_groups.h makes both). The units shard over their group (one
  // machine's ranks: gathers and reduce-scatters stay on its fast links) and each gradient
  // shard is then averaged over this group (one all-reduce of 1/shard-size of the gradient
  // crosses machines, overlapped with the rest of backward). Give the units and the root the
  // same. Null: FSDP over the group alone.
  std::shared_ptr<ProcessGroup> replicate_group;
};

}  // namespace datapar
