// dcp::add_fsdp / add_fsdp_optimizer / apply_fsdp_optimizer. See datapar/dcp/fsdp_state.h.
#include "datapar/dcp/fsdp_state.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <map>
#include <unordered_map>
#include <unordered_set>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "datapar/state_dict.h"
#include "datapar/optim/optimizer_state.h"
#include "dcp/metadata.h"
#include "dcp/optimizer_layout.h"
#include "optim/param_state.h"

namespace datapar::dcp::detail {
namespace {

using c10::IValue;
using datapar::detail::str_cat;
using Dict = c10::impl::GenericDict;

// The boxes of `range` as views of `flat` (a tensor of the shard's shape: the shard itself, or
// an optimizer state of it), so that loading writes into it.
std::vector<Shard> boxes_of(const ShardRange& range, const at::Tensor& flat) {
  std::vector<Shard> boxes = flat_range_boxes(range.sizes, range.begin, range.end);
  const at::Tensor data = flat.detach();
  int64_t at = range.offset;
  for (Shard& box : boxes) {
    const int64_t n = volume(box.global_size);
    box.local = data.narrow(0, at, n).view(box.global_size);
    box.global_size = range.sizes;
    at += n;
  }
  return boxes;
}

// Optimizer parameter index -> shard index, checking that the optimizer holds the shards.
std::vector<size_t> shards_of(const torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& shards) {
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < shards.size(); ++i) index.emplace(shards[i].unsafeGetTensorImpl(), i);
  std::vector<size_t> out;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      DATAPAR_CHECK(it != index.end(),
                    "dcp::add_fsdp_optimizer: the optimizer holds a tensor that is not one of the "
                    "FSDP shards; build it over fsdp.parameters()");
      out.push_back(it->second);
    }
  }
  return out;
}

}  // namespace

void add_fsdp_model(State& state, const std::string& prefix, const torch::nn::Module& module,
                    const std::vector<ShardRange>& ranges, const std::vector<at::Tensor>& shards) {
  std::unordered_set<std::string> parameters;
  for (const ShardRange& r : ranges) {
    parameters.insert(r.name);
    state.put(prefix + "." + r.name, boxes_of(r, shards.at(r.shard)), r.sizes, shards.at(r.shard).scalar_type(),
              {IValue(prefix), IValue(r.name)});
  }
  for (const auto& item : datapar::state_dict(module)) {
    if (parameters.count(item.key()) == 0) {
      state.put(prefix + "." + item.key(), item.value(), {IValue(prefix), IValue(item.key())});
    }
  }
}

void add_fsdp_optimizer(State& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                        const std::vector<ShardRange>& ranges, const std::vector<at::Tensor>& shards) {
  const std::vector<size_t> shard_of = shards_of(optimizer, shards);
  create_missing_state(optimizer);
  const OptimizerState osd = optimizer_state_dict(optimizer);
  std::map<size_t, Dict> per_shard;  // shard index -> its state
  for (const auto& item : osd.at("state").toGenericDict()) {
    per_shard.emplace(shard_of.at(static_cast<size_t>(item.key().toInt())), item.value().toGenericDict());
  }
  for (const ShardRange& r : ranges) {
    const auto it = per_shard.find(r.shard);
    if (it == per_shard.end()) continue;
    for (const auto& kv : it->second) {
      const std::string& key = kv.key().toStringRef();
      const at::Tensor& t = kv.value().toTensor();
      const std::string name = str_cat(prefix, ".state.", r.name, ".", key);
      const std::vector<IValue> path = {IValue(prefix), IValue("state"), IValue(r.name), IValue(key)};
      if (t.numel() == shards.at(r.shard).numel() && t.dim() == 1) {
        state.put(name, boxes_of(r, t), r.sizes, t.scalar_type(), path);
      } else {  // the step: one per shard, the same on every rank
        state.put(name, t, path);
      }
    }
  }
  // Each group's parameters: the names of what its shards hold, in the model's order.
  std::vector<size_t> first_of_group;  // the group's first optimizer index
  size_t count = 0;
  for (const IValue& group : osd.at("param_groups").toListRef()) {
    first_of_group.push_back(count);
    count += group.toGenericDict().at("params").toListRef().size();
  }
  const bool adamw = datapar::detail::optimizer_kind(optimizer) == datapar::detail::OptimizerKind::kAdamW;
  add_param_groups(state, prefix, osd, adamw, [&](int64_t g, const Dict& group) {
    std::unordered_set<size_t> in_group;
    const size_t first = first_of_group.at(static_cast<size_t>(g));
    for (size_t i = first; i < first + group.at("params").toListRef().size(); ++i) in_group.insert(shard_of.at(i));
    c10::impl::GenericList names(c10::AnyType::get());
    for (const ShardRange& r : ranges) {
      if (in_group.count(r.shard) > 0) names.push_back(r.name);
    }
    return names;
  });
}

void apply_fsdp_optimizer(const State& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                          const std::vector<ShardRange>& ranges, const std::vector<at::Tensor>& shards) {
  const std::vector<size_t> shard_of = shards_of(optimizer, shards);
  const OptimizerState current = optimizer_state_dict(optimizer);
  std::map<size_t, std::string> first_name;  // a shard's first parameter: whose step the shard takes
  for (const ShardRange& r : ranges) first_name.emplace(r.shard, r.name);
  Dict per_param(c10::AnyType::get(), c10::AnyType::get());
  for (const auto& item : current.at("state").toGenericDict()) {
    Dict s = item.value().toGenericDict().copy();
    const size_t shard = shard_of.at(static_cast<size_t>(item.key().toInt()));
    if (s.contains("step") && first_name.count(shard) > 0) {
      s.insert_or_assign("step", state.tensor(str_cat(prefix, ".state.", first_name.at(shard), ".step")));
    }
    per_param.insert(item.key(), s);
  }
  OptimizerState osd(c10::AnyType::get(), c10::AnyType::get());
  osd.insert("state", per_param);
  osd.insert("param_groups", loaded_param_groups(state, prefix, current));
  load_optimizer_state_dict(optimizer, osd);
}

}  // namespace datapar::dcp::detail

namespace datapar::dcp {

void save(const State& state, const std::string& dir, const HybridGroups& groups) {
  DATAPAR_CHECK(groups.shard && groups.replicate, "dcp::save: the hybrid groups are not made (hybrid_groups()).");
  ProcessGroup& replicas = *groups.replicate;
  std::exception_ptr failed;
  if (replicas.rank() == 0) {
    try {
      save(state, dir, *groups.shard);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  // The first replica's outcome to the others, so that none returns before the checkpoint
  // is whole, nor believes one was written when it was not.
  at::Tensor saved = metadata_tensor(replicas, std::vector<int64_t>{failed ? 0 : 1});
  replicas.broadcast(saved, 0)->wait();
  if (failed) std::rethrow_exception(failed);
  if (host_int64s(saved).at(0) != 1) {
    throw CheckpointError(datapar::detail::str_cat(
        "dcp::save: the first replica failed to write the checkpoint in ", dir, " (its ranks say why); this replica "
        "holds the same shards and wrote nothing. The directory is not a checkpoint."));
  }
}

}  // namespace datapar::dcp
