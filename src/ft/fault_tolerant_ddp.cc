// The non-template parts of FaultTolerantDdp. See datapar/ft/fault_tolerant_ddp.h.
#include "datapar/ft/fault_tolerant_ddp.h"

#include <ATen/core/Dict.h>
#include <c10/util/Exception.h>

#include <sstream>

#include "datapar/optim/optimizer_state.h"
#include "datapar/state_dict.h"
#include "ft/standings.h"
#include "serialization/torch_file.h"

namespace datapar::ft::detail {
namespace {

using datapar::detail::str_cat;
using Dict = c10::impl::GenericDict;

c10::IValue field(const Dict& state, const char* key) {
  const auto it = state.find(key);
  if (it == state.end()) throw CheckpointError(str_cat("ft: the state a member sent has no \"", key, "\" entry."));
  return it->value();
}

std::string shape(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

}  // namespace

Resharded reshard_zero(ZeroRedundancyOptimizer& zero, ProcessGroup& group, Standing& mine,
                       const std::function<void()>& apply_missed_vote) {
  const std::vector<at::Tensor>& params = zero.parameters();
  const int n = group.size(), me = group.rank();
  // Every member's standing, and which parameters' state it keeps.
  std::vector<int64_t> kept(params.size());
  for (size_t i = 0; i < params.size(); ++i) kept[i] = zero.keeps(i) ? 1 : 0;
  const Standings standings(group, mine, kept);
  if (standings.applies_missed_vote(me)) {  // at once in `mine`: a failure below must not apply it twice
    if (apply_missed_vote) {
      apply_missed_vote();
    } else {
      zero.update();
    }
    mine = {standings.step(me), mine.voted_epoch, -1, 0};
  }
  const int64_t newest = standings.newest();
  auto has = [&](int r, size_t i) { return standings.step(r) == newest && standings.kept(r, i) == 1; };
  std::vector<int> source(params.size(), -1);
  for (size_t i = 0; i < params.size(); ++i) {
    for (int r = 0; r < n && source[i] < 0; ++r) {
      if (has(r, i)) source[i] = r;
    }
    if (source[i] < 0) {
      throw MembershipError(str_cat(
          "ft: no member has the optimizer state of parameter ", i, " (", shape(params[i]), ") at step ", newest,
          ": both members that kept it left the job at once. The job cannot go on from memory.\n---> HINT: start it "
          "again from its last checkpoint (datapar launch ... --resume); a shard is kept by two neighbouring ranks, "
          "so one failure at a time loses nothing."));
    }
  }
  // Not the group's owner: the membership's ElasticGroup is, and retires it on a thread of
  // its own when the epoch ends; the next epoch reshards before `zero` shares again.
  zero.reshard(std::shared_ptr<ProcessGroup>(std::shared_ptr<ProcessGroup>(), &group), source, has);
  mine = {newest, mine.commit_epoch, -1, 0};
  return {newest, standings.first_at_newest()};
}

std::string save_training_state(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                                int64_t step) {
  Dict model(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : state_dict(module)) model.insert(item.key(), item.value());
  Dict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("model", model);
  state.insert("optimizer", optimizer_state_dict(optimizer));
  state.insert("step", step);
  return datapar::detail::torch_save_bytes(state);
}

int64_t load_training_state(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const std::string& bytes) {
  const c10::IValue root = datapar::detail::torch_load_bytes(bytes.data(), bytes.size());
  if (!root.isGenericDict()) throw CheckpointError("ft: the state a member sent is not a dict.");
  const Dict state = root.toGenericDict();
  const c10::IValue model = field(state, "model");
  const c10::IValue optimizer_state = field(state, "optimizer");
  const c10::IValue step = field(state, "step");
  if (!model.isGenericDict() || !optimizer_state.isGenericDict() || !step.isInt()) {
    throw CheckpointError("ft: the state a member sent has entries of the wrong types.");
  }
  StateDict tensors;
  for (const auto& e : model.toGenericDict()) {
    if (!e.key().isString() || !e.value().isTensor()) throw CheckpointError("ft: a model entry is not a named tensor.");
    tensors.insert(e.key().toStringRef(), e.value().toTensor());
  }
  load_state_dict(module, tensors, /*strict=*/true);
  load_optimizer_state_dict(optimizer, optimizer_state.toGenericDict());
  return step.toInt();
}

}  // namespace datapar::ft::detail
