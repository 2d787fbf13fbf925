// See fully_sharded_data_parallel.h.
#include "datapar/fsdp/fully_sharded_data_parallel.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "fsdp/fsdp_optimizer_state.h"
#include "fsdp/fsdp_run.h"
#include "fsdp/fsdp_unit.h"

namespace datapar::detail {
namespace {

constexpr const char* kLayoutKey = "_fsdp.layout";

std::string shard_key(const FsdpUnit& unit) { return "_fsdp.shard." + unit.name(); }

// Where each unit's parameter is: its unit and offset in the unit's flat values.
struct ParamPlace {
  FsdpUnit* unit;
  int64_t offset;
};

std::unordered_map<const void*, ParamPlace> places_of(const std::vector<std::shared_ptr<FsdpUnit>>& units) {
  std::unordered_map<const void*, ParamPlace> places;
  for (const auto& unit : units) {
    int64_t offset = 0;
    for (const at::Tensor& p : unit->params()) {
      places.emplace(p.unsafeGetTensorImpl(), ParamPlace{unit.get(), offset});
      offset += p.numel();
    }
  }
  return places;
}

}  // namespace

FsdpCore::FsdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group, FsdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  DATAPAR_CHECK(module_ != nullptr, "FullyShardedDataParallel: the module is null.");
  if (!group_) group_ = default_group();
  DATAPAR_CHECK(options_.replicate_group != group_, "FullyShardedDataParallel: FsdpOptions::replicate_group is the ",
                "group it shards over; hybrid sharding replicates across the other shard groups (hybrid_groups()).");
  std::vector<std::shared_ptr<FsdpUnit>> units;
  // The root's own unit: the parameters outside every unit.
  std::vector<at::Tensor> own = unit_parameters(*module_);
  if (!own.empty()) {
    FsdpOptions root = options_;
    root.reshard_after_forward = false;  // its parameters are the first backward needs
    root.reshard_after_forward_group = nullptr;
    units.push_back(std::make_shared<FsdpUnit>("(root)", std::move(own), group_, root));
    units.back()->install_hooks();
    units.back()->cast_buffers(unit_buffers(*module_));
    root_ = units.back().get();
  }
  // Note [Units sharded in place]
  // A unit whose wrapper the model calls (a Sequential's element) is gathered when its
  // wrapper's forward begins. A module sharded in place whose parent calls it directly
  // (fully_shard(net->fc1)) has no such moment: libtorch modules have no forward hooks. Those
  // units are gathered with the root's own when its forward begins and kept, as it is, until
  // their backward has produced their gradients.
  std::unordered_set<const FsdpUnit*> seen;
  const auto add = [&](const std::string& name, const std::shared_ptr<FsdpUnit>& unit) {
    DATAPAR_CHECK(unit->group() == group_, "FullyShardedDataParallel: unit '", name,
                  "' shards over another process group than the root's; make the units and the root with one group.");
    DATAPAR_CHECK(unit->options().replicate_group == options_.replicate_group, "FullyShardedDataParallel: unit '",
                  name, "' has another FsdpOptions::replicate_group than the root's; under hybrid sharding give ",
                  "the units and the root the same one (hybrid_groups().replicate), elsewhere none.");
    DATAPAR_CHECK(!unit->attached(), "FullyShardedDataParallel: unit '", name, "' belongs to another ",
                  "FullyShardedDataParallel already; wrap a model in one FullyShardedDataParallel.");
    unit->set_name(name);
    units.push_back(unit);
  };
  const auto named = module_->named_modules();
  for (const auto& item : named) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(item.value().get());
    if (sharded == nullptr || !seen.insert(&sharded->unit()).second) continue;
    add(item.key(), unit_of(*sharded->wrapped()));
  }
  for (const auto& item : named) {
    const std::shared_ptr<FsdpUnit> unit = unit_of(*item.value());
    if (unit == nullptr || !seen.insert(unit.get()).second) continue;
    DATAPAR_CHECK(item.value().get() != module_.get(), "FullyShardedDataParallel: the model itself was made a unit ",
                  "by fully_shard; shard its submodules and let FullyShardedDataParallel be the root.");
    add(item.key(), unit);
    unit->keep_through_forward();
    unbracketed_.push_back(unit.get());
  }
  DATAPAR_CHECK(!units.empty(), "FullyShardedDataParallel: the module has no trainable parameters to shard.");
  // Every rank starts from rank 0's buffers (the units took rank 0's parameters).
  std::vector<at::Tensor> buffers = module_->buffers();
  if (!buffers.empty() && group_->size() > 1) group_->broadcast_coalesced(buffers, 0)->wait();
  const std::shared_ptr<ProcessGroup>& replicas = options_.replicate_group;
  if (!buffers.empty() && replicas && replicas->size() > 1) replicas->broadcast_coalesced(buffers, 0)->wait();
  run_ = std::make_unique<FsdpRun>(group_, options_, std::move(units));
}

FsdpCore::~FsdpCore() = default;

void FsdpCore::pre_forward(int64_t samples) {
  run_->begin_iteration(samples);
  // The root's layers and the units sharded in place may run anywhere in forward.
  for (FsdpUnit* unit : unbracketed_) unit->start_gather();
  if (root_ != nullptr) root_->pre_forward();
  for (FsdpUnit* unit : unbracketed_) unit->pre_forward();
}

void FsdpCore::post_forward(const c10::IValue& outputs) {
  if (root_ != nullptr) root_->post_forward(outputs);
  for (FsdpUnit* unit : unbracketed_) unit->post_forward(outputs);
}

at::Tensor FsdpCore::cast_input(const at::Tensor& input) const {
  if (!options_.param_dtype || !input.defined() || !at::isFloatingType(input.scalar_type())) return input;
  return input.to(*options_.param_dtype);
}

std::vector<at::Tensor> FsdpCore::parameters() const {
  std::vector<at::Tensor> shards;
  for (const auto& unit : run_->units()) shards.push_back(unit->shard());
  return shards;
}

int64_t FsdpCore::shard_numel() const {
  int64_t numel = 0;
  for (const auto& unit : run_->units()) numel += unit->shard().numel();
  return numel;
}

int64_t FsdpCore::gathered_numel() const {
  int64_t numel = 0;
  for (const auto& unit : run_->units()) numel += unit->gathered() ? unit->padded_numel() : 0;
  return numel;
}

size_t FsdpCore::units() const { return run_->units().size(); }

int64_t FsdpCore::largest_unit_numel() const {
  int64_t largest = 0;
  for (const auto& unit : run_->units()) largest = std::max(largest, unit->padded_numel());
  return largest;
}
bool FsdpCore::sync() const { return run_->sync(); }
void FsdpCore::set_sync(bool on) { run_->set_sync(on); }

double FsdpCore::clip_grad_norm(double max_norm, double norm_type) {
  DATAPAR_CHECK(max_norm >= 0 && norm_type > 0, "FullyShardedDataParallel::clip_grad_norm_: max_norm ", max_norm,
                " and norm_type ", norm_type, " must be non-negative and positive.");
  const bool infinity = std::isinf(norm_type);
  const at::TensorOptions options = at::TensorOptions(group_->device()).dtype(at::kDouble);
  at::Tensor local = at::zeros({1}, options);
  for (const at::Tensor& shard : parameters()) {
    if (!shard.grad().defined()) continue;
    const at::Tensor grad = shard.grad().detach().to(at::kDouble);
    if (infinity) {
      local = at::maximum(local, grad.abs().max().reshape({1}).to(local.device()));
    } else {
      local += grad.abs().pow(norm_type).sum().to(local.device());  // gloo takes CUDA shards; its sums live on the CPU
    }
  }
  group_->all_reduce(local, infinity ? ReduceOp::kMax : ReduceOp::kSum)->wait();
  const double total = infinity ? local.item<double>() : std::pow(local.item<double>(), 1.0 / norm_type);
  // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (total + 1e-6) when that is below 1.
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1.0) {
    const at::NoGradGuard no_grad;
    for (const at::Tensor& shard : parameters()) {
      if (shard.grad().defined()) shard.grad().mul_(coefficient);
    }
  }
  return total;
}

std::vector<ShardRange> FsdpCore::shard_ranges() const {
  const std::unordered_map<const void*, ParamPlace> places = places_of(run_->units());
  std::unordered_map<const FsdpUnit*, size_t> shard_of;
  for (size_t i = 0; i < run_->units().size(); ++i) shard_of.emplace(run_->units()[i].get(), i);
  std::vector<ShardRange> out;
  for (const auto& item : module_->named_parameters()) {
    const auto place = places.find(item.value().unsafeGetTensorImpl());
    if (place == places.end()) continue;
    const FsdpUnit& unit = *place->second.unit;
    const int64_t lo = group_->rank() * unit.shard().numel(), hi = lo + unit.shard().numel();
    const int64_t at = place->second.offset;
    const int64_t first = std::max(at, lo), last = std::min(at + item.value().numel(), hi);
    ShardRange r;
    r.name = item.key();
    r.sizes = item.value().sizes().vec();
    r.shard = shard_of.at(&unit);
    r.unit_offset = at;
    if (first < last) {
      r.offset = first - lo;
      r.begin = first - at;
      r.end = last - at;
    }
    out.push_back(std::move(r));
  }
  return out;
}

StateDict FsdpCore::full_state_dict() const {
  const std::unordered_map<const void*, ParamPlace> places = places_of(run_->units());
  std::unordered_map<const FsdpUnit*, at::Tensor> values;
  for (const auto& unit : run_->units()) values.emplace(unit.get(), unit->full_values());
  StateDict out;
  for (const auto& item : datapar::state_dict(*module_)) {
    const at::Tensor& tensor = item.value();
    const auto place = places.find(tensor.unsafeGetTensorImpl());
    if (place == places.end()) {
      at::Tensor value = tensor.detach().clone();
      for (const auto& unit : run_->units()) {  // a buffer kept in FsdpOptions::buffer_dtype
        if (const auto dtype = unit->original_dtype(tensor)) value = value.to(*dtype);
      }
      out.insert(item.key(), std::move(value));
    } else {
      const at::Tensor& flat = values.at(place->second.unit);
      out.insert(item.key(), flat.narrow(0, place->second.offset, tensor.numel()).view(tensor.sizes()).clone());
    }
  }
  return out;
}

void FsdpCore::load_full_state_dict(const StateDict& state, bool strict) {
  const std::unordered_map<const void*, ParamPlace> places = places_of(run_->units());
  std::unordered_map<const FsdpUnit*, at::Tensor> values;
  for (const auto& unit : run_->units()) {
    values.emplace(unit.get(), at::zeros({unit->numel()}, unit->shard().options().requires_grad(false)));
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> others;  // (the module's tensor, the saved one)
  std::unordered_set<std::string> known;
  for (const auto& item : datapar::state_dict(*module_)) {
    known.insert(item.key());
    const at::Tensor* saved = state.find(item.key());
    if (saved == nullptr) {
      DATAPAR_CHECK(!strict, "FullyShardedDataParallel::load_full_state_dict: the state dict has no '", item.key(),
                    "' (strict). Is it this model's? Pass strict = false to load what matches.");
      continue;
    }
    const at::Tensor& tensor = item.value();
    DATAPAR_CHECK(saved->sizes() == tensor.sizes(), "FullyShardedDataParallel::load_full_state_dict: '", item.key(),
                  "' is ", saved->sizes(), " in the state dict and ", tensor.sizes(), " in the model.");
    const auto place = places.find(tensor.unsafeGetTensorImpl());
    if (place == places.end()) {
      others.emplace_back(tensor, *saved);
    } else {
      values.at(place->second.unit).narrow(0, place->second.offset, tensor.numel()).copy_(saved->reshape({-1}));
    }
  }
  if (strict) {
    for (const auto& item : state) {
      DATAPAR_CHECK(known.count(item.key()) > 0, "FullyShardedDataParallel::load_full_state_dict: '", item.key(),
                    "' is not in the model (strict). Pass strict = false to ignore it.");
    }
  }
  // Checked everything: now load.
  for (const auto& unit : run_->units()) unit->load_full_values(values.at(unit.get()));
  const at::NoGradGuard no_grad;
  for (auto& [tensor, saved] : others) tensor.copy_(saved);
}

OptimizerState FsdpCore::full_optimizer_state(const torch::optim::Optimizer& optimizer) const {
  return detail::full_optimizer_state(*module_, run_->units(), optimizer);
}

void FsdpCore::load_full_optimizer_state(torch::optim::Optimizer& optimizer, const OptimizerState& state) {
  detail::load_full_optimizer_state(*module_, run_->units(), optimizer, state);
}

at::Tensor FsdpCore::layout() const {
  std::vector<int64_t> layout = {group_->size(), group_->rank(), static_cast<int64_t>(run_->units().size())};
  for (const auto& unit : run_->units()) layout.push_back(unit->numel());
  return at::tensor(layout, at::kLong);
}

StateDict FsdpCore::sharded_state_dict() const {
  StateDict out;
  out.insert(kLayoutKey, layout());
  for (const auto& unit : run_->units()) out.insert(shard_key(*unit), unit->shard().detach().clone());
  for (const auto& item : module_->named_buffers()) out.insert(item.key(), item.value().detach().clone());
  return out;
}

void FsdpCore::load_sharded_state_dict(const StateDict& state) {
  constexpr const char* kWhat = "FullyShardedDataParallel::load_sharded_state_dict: ";
  const at::Tensor* saved_layout = state.find(kLayoutKey);
  DATAPAR_CHECK(saved_layout != nullptr && saved_layout->scalar_type() == at::kLong && saved_layout->dim() == 1 &&
                    saved_layout->numel() >= 3,
                kWhat, "this is not a sharded state dict (no valid '", kLayoutKey,
                "'); a full one loads with load_full_state_dict.");
  const at::Tensor want = layout();
  const at::Tensor got = saved_layout->contiguous();
  const int64_t* w = want.data_ptr<int64_t>();
  const int64_t* g = got.data_ptr<int64_t>();
  DATAPAR_CHECK(g[0] == w[0], kWhat, "it was saved by ", g[0], " ranks and this job has ", w[0],
                ". Shards fit only their world size: load a full state dict (full_state_dict) to change it.");
  DATAPAR_CHECK(g[1] == w[1], kWhat, "it is rank ", g[1], "'s shard and this is rank ", w[1],
                ": each rank loads the one it saved.");
  DATAPAR_CHECK(got.numel() == want.numel() && g[2] == w[2], kWhat, "it has ", g[2], " units and this model ", w[2],
                ": it was saved from another model (or other units).");
  for (int64_t i = 0; i < w[2]; ++i) {
    const FsdpUnit& unit = *run_->units()[static_cast<size_t>(i)];
    DATAPAR_CHECK(g[3 + i] == w[3 + i], kWhat, "unit '", unit.name(), "' has ", w[3 + i], " parameters here and ",
                  g[3 + i], " in the state dict: it was saved from another model.");
    const at::Tensor* shard = state.find(shard_key(unit));
    DATAPAR_CHECK(shard != nullptr && shard->numel() == unit.shard().numel(), kWhat, "the shard of unit '", unit.name(),
                  "' is missing or of the wrong size.");
  }
  for (const auto& item : module_->named_buffers()) {
    const at::Tensor* buffer = state.find(item.key());
    DATAPAR_CHECK(buffer != nullptr && buffer->sizes() == item.value().sizes(), kWhat, "buffer '", item.key(),
                  "' is missing or of another shape.");
  }
  const at::NoGradGuard no_grad;
  for (const auto& unit : run_->units()) unit->shard().detach().copy_(*state.find(shard_key(*unit)));
  for (const auto& item : module_->named_buffers()) item.value().copy_(*state.find(item.key()));
}

}  // namespace datapar::detail
