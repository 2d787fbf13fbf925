// FullyShardedDataParallel: each rank keeps 1/N of the model's parameters, their gradients
// and (through the optimizer it gives them to) their optimizer state, as ZeRO-3 and
// PyTorch's FSDP do. Each unit's parameters are gathered whole just before the unit runs
// and freed after; gradients are reduce-scattered, averaged over the ranks, into the shards
// as backward goes.
//
//   models::ResNet18 model;                                            // same on every rank
//   datapar::fully_shard_each<models::ResidualImpl>(*model, group);     // units (fully_shard.h)
//   datapar::FullyShardedDataParallel fsdp(model, group);              // the root
//   torch::optim::Adam adam(fsdp.parameters(), 1e-3);                  // the shards
//   for (...) { adam.zero_grad(); loss(fsdp.forward(x), y).backward(); adam.step(); }
//
// The root is this wrapper rather than a fully_shard(root) call, as PyTorch's: libtorch
// modules have no forward hooks, so something must bracket the model's forward, and the
// root owns what spans the units: their order (Note [Prefetching units] in fsdp_run.cc),
// no_sync, the end of backward, clipping and state dicts. Parameters outside every unit
// form the root's own unit, which stays gathered from forward to its backward (PyTorch's
// root does the same).
//
// - Memory: between steps 1/N of everything; during forward and backward also the units
//   gathered at that moment: the one computing, the `prefetch` next and the root's own
//   (and with reshard_after_forward = false, every unit run since forward began).
// - The module's parameters stay its own tensors: each is a view of its unit's flat buffer
//   (Note [Parameters over a flat buffer] in fsdp_unit.cc), holding no memory between steps:
//   the module's own forward, called outside this one's, throws (libtorch: "its data is not
//   allocated"). Evaluate through fsdp.forward() (with or without grad).
// - Starts every rank from rank 0's parameters and buffers. Gradients are the average over
//   the ranks (or over samples), as DDP's. Buffers (BatchNorm's running statistics) are
//   each rank's own after that, as in PyTorch's FSDP.
// - Every rank must run the same units in the same order (the collectives match by order).
// - Not thread-safe: one forward/backward at a time.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "datapar/fsdp/fsdp_options.h"
#include "datapar/fsdp/fully_shard.h"
#include "datapar/parallel/leading_rows.h"
#include "datapar/process_group/process_group.h"
#include "datapar/state_dict.h"
#include "datapar/optim/optimizer_state.h"

namespace datapar {
namespace detail {

class FsdpRun;
class FsdpUnit;

}  // namespace detail

// Where this rank's shards (FullyShardedDataParallel::parameters()) hold a parameter of the
// model: elements [begin, end) of the flattened parameter `name`, of `sizes`, at `offset` of
// shard `shard` (the shard of unit `shard`); begin == end when this rank holds none of it.
struct ShardRange {
  std::string name;
  std::vector<int64_t> sizes;
  size_t shard = 0;
  int64_t offset = 0;
  int64_t begin = 0;
  int64_t end = 0;
  // Where its first element sits in the flat buffer of unit `shard` (every rank's shard of
  // it side by side): the same on every rank.
  int64_t unit_offset = 0;
};

namespace detail {

// The non-template part of FullyShardedDataParallel.
class FsdpCore {
 public:
  FsdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group, FsdpOptions options);
  ~FsdpCore();
  FsdpCore(const FsdpCore&) = delete;
  FsdpCore& operator=(const FsdpCore&) = delete;

  void pre_forward(int64_t samples);
  // `outputs`: what the module's forward returned (tensors, nested in lists, tuples, dicts).
  void post_forward(const c10::IValue& outputs);
  at::Tensor cast_input(const at::Tensor& input) const;

  std::vector<at::Tensor> parameters() const;
  int64_t shard_numel() const;
  int64_t gathered_numel() const;
  size_t units() const;
  int64_t largest_unit_numel() const;
  bool sync() const;
  void set_sync(bool on);
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  double clip_grad_norm(double max_norm, double norm_type);
  StateDict full_state_dict() const;
  void load_full_state_dict(const StateDict& state, bool strict);
  StateDict sharded_state_dict() const;
  void load_sharded_state_dict(const StateDict& state);
  OptimizerState full_optimizer_state(const torch::optim::Optimizer& optimizer) const;
  void load_full_optimizer_state(torch::optim::Optimizer& optimizer, const OptimizerState& state);
  std::vector<ShardRange> shard_ranges() const;

 private:
  at::Tensor layout() const;

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  FsdpOptions options_;
  std::unique_ptr<FsdpRun> run_;
  FsdpUnit* root_ = nullptr;  // the unit of the parameters outside every unit, if any
  // Units sharded in place whose forward nothing brackets (Note [Units sharded in place]).
  std::vector<FsdpUnit*> unbracketed_;
};

}  // namespace detail

template <typename ModuleImpl>
class FullyShardedDataParallel {
 public:
  // Collective: every rank, the same model, after its units were made. group: the ranks to
  // shard over, the units' (default: datapar::default_group()).
  FullyShardedDataParallel(std::shared_ptr<ModuleImpl> module, std::shared_ptr<ProcessGroup> group = nullptr,
                           FsdpOptions options = {})
      : module_(std::move(module)), core_(std::make_shared<detail::FsdpCore>(module_, std::move(group), options)) {}

  FullyShardedDataParallel(const torch::nn::ModuleHolder<ModuleImpl>& module,
                           std::shared_ptr<ProcessGroup> group = nullptr, FsdpOptions options = {})
      : FullyShardedDataParallel(module.ptr(), std::move(group), options) {}

  // Runs the module's forward, each unit gathered in turn. Floating-point tensor arguments
  // are cast to FsdpOptions::param_dtype, when set.
  template <typename... Args>
  auto forward(Args&&... args) {
    core_->pre_forward(detail::leading_rows(args...));
    auto output = module_->forward(cast(std::forward<Args>(args))...);
    core_->post_forward(c10::IValue(output));  // the same tensors: hooks set on them are the caller's
    return output;
  }

  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // This rank's shards of the parameters (one flat tensor per unit): give them to the
  // optimizer.
  std::vector<at::Tensor> parameters() const { return core_->parameters(); }

  // A scope in which backward keeps the gradients unsharded in the parameters' .grad
  // (accumulation without communication, as PyTorch's set_requires_gradient_sync(False));
  // the first backward outside it reduce-scatters their sum:
  //   { auto guard = fsdp.no_sync(); loss(fsdp.forward(x1)).backward(); }
  //   loss(fsdp.forward(x2)).backward();
  class NoSync {
   public:
    explicit NoSync(std::shared_ptr<detail::FsdpCore> core) : core_(std::move(core)), before_(core_->sync()) {
      core_->set_sync(false);
    }
    ~NoSync() { core_->set_sync(before_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    std::shared_ptr<detail::FsdpCore> core_;
    bool before_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(core_); }

  // Scales the shards' gradients so that the norm of the whole model's gradient is at most
  // max_norm, as torch::nn::utils::clip_grad_norm_ on the unsharded model would (the local
  // sums are all-reduced; norm_type may be infinity). Collective. Returns the total norm.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0) { return core_->clip_grad_norm(max_norm, norm_type); }

  // The unsharded model's state dict (its own names; parameters in the shards' dtype), on
  // every rank: collective. Saved with save_state_dict, Python's torch.load reads it and
  // an unsharded model (or FSDP at any world size) loads it.
  StateDict full_state_dict() const { return core_->full_state_dict(); }
  // Each rank takes its part of a full state dict: any world size's. Collective-free.
  // strict: every name must be there and no other. Throws InvalidArgumentError naming a
  // missing, unexpected or misshapen entry; nothing is loaded then.
  void load_full_state_dict(const StateDict& state, bool strict = true) { core_->load_full_state_dict(state, strict); }
  // The optimizer's state (an optimizer over parameters(), one group) as the unsharded
  // model's optimizer would have it: PyTorch's optimizer.state_dict() layout, parameters
  // numbered as module->parameters() lists them (optim/optimizer_state.h), on every rank.
  // Collective. With full_state_dict(), a checkpoint that an unsharded run, Python, or FSDP
  // at any world size resumes from.
  OptimizerState full_optimizer_state(const torch::optim::Optimizer& optimizer) const {
    return core_->full_optimizer_state(optimizer);
  }
  // Each rank takes its part of such a state (from any world size, or an unsharded run).
  void load_full_optimizer_state(torch::optim::Optimizer& optimizer, const OptimizerState& state) {
    core_->load_full_optimizer_state(optimizer, state);
  }
  // This rank's shards and buffers, with the layout they belong to (world size, rank, each
  // unit's size): small, written by every rank. Loading checks the layout and refuses
  // another world size, rank or model with an error that says which.
  StateDict sharded_state_dict() const { return core_->sharded_state_dict(); }
  void load_sharded_state_dict(const StateDict& state) { core_->load_sharded_state_dict(state); }

  // Elements of the parameters gathered whole now, over all units.
  int64_t gathered_numel() const { return core_->gathered_numel(); }
  bool gathered() const { return gathered_numel() > 0; }
  // Elements this rank keeps between steps (its shards, with padding).
  int64_t shard_numel() const { return core_->shard_numel(); }
  // The units, the root's own included (when it has parameters outside every unit).
  size_t units() const { return core_->units(); }
  // Elements of the largest unit's parameters, gathered whole (padded).
  int64_t largest_unit_numel() const { return core_->largest_unit_numel(); }
  const std::shared_ptr<ModuleImpl>& module() const { return module_; }

  // Each parameter of the model, in named_parameters() order, and what this rank's shards
  // hold of it (dcp/fsdp_state.h saves and loads them so, in PyTorch's DCP format).
  std::vector<ShardRange> shard_ranges() const { return core_->shard_ranges(); }
  const std::shared_ptr<ProcessGroup>& process_group() const { return core_->group(); }

  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }

 private:
  template <typename T>
  decltype(auto) cast(T&& arg) const {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      return core_->cast_input(arg);
    } else {
      return std::forward<T>(arg);
    }
  }

  std::shared_ptr<ModuleImpl> module_;
  std::shared_ptr<detail::FsdpCore> core_;
};

template <typename ModuleImpl>
FullyShardedDataParallel(std::shared_ptr<ModuleImpl>) -> FullyShardedDataParallel<ModuleImpl>;
template <typename ModuleImpl>
FullyShardedDataParallel(std::shared_ptr<ModuleImpl>, std::shared_ptr<ProcessGroup>)
    -> FullyShardedDataParallel<ModuleImpl>;
template <typename ModuleImpl>
FullyShardedDataParallel(std::shared_ptr<ModuleImpl>, std::shared_ptr<ProcessGroup>, FsdpOptions)
    -> FullyShardedDataParallel<ModuleImpl>;

}  // namespace datapar
