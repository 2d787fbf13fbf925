// Units of fully sharded data parallelism: a submodule whose parameters are gathered just
// before its forward and freed after, so that only one unit (and the ones prefetched) is
// whole at a time, as PyTorch's fully_shard(submodule) does.
//
//   models::ResNet18 model;
//   datapar::fully_shard_each<models::ResidualImpl>(*model, group);  // each block a unit
//   datapar::FullyShardedDataParallel fsdp(model, group);             // the root: the rest
//
// On a model of one's own, with named members, as in PyTorch (bottom-up, inner modules
// first; the root last):
//
//   datapar::fully_shard(net->fc1, group);
//   datapar::fully_shard(net->fc2, group);
//   datapar::FullyShardedDataParallel fsdp(net, group);
//
// fully_shard shards the module in place (a unit handle is registered among its children,
// "_fsdp_unit", and keeps the unit alive as long as the module) and returns a module that
// wraps it. Where the model calls the unit matters, because libtorch modules have no forward
// hooks (PyTorch's fully_shard registers some):
// - Put where the model calls it (an element of a Sequential: what fully_shard_each does
//   there), the returned wrapper brackets the unit's forward: its parameters are gathered
//   just before it runs and freed after, prefetched by the order of the last iteration.
// - A named member its parent's forward calls directly (net->fc1) cannot be bracketed: its
//   unit is gathered when the root's forward begins and kept until the unit's backward has
//   produced its gradients, which are then reduce-scattered and the parameters freed as
//   backward goes on (the root's own parameters are kept the same way). Parameters,
//   gradients and optimizer state are sharded between steps as for every unit; during
//   forward these units are whole.
// The wrapper lists the submodule's own parameters, buffers and children under their own
// names, so the model's parameter and state-dict names stay those of the unwrapped model
// ("layers.0.weight", never "layers.0.module.weight").
//
// - A unit shards its parameters when it is made (every rank takes rank 0's values); it
//   trains only under a FullyShardedDataParallel root made afterwards over the whole model.
// - A module is sharded once: fully_shard on a unit, or on a module whose parameters a unit
//   holds already (an outer module sharded before an inner one), throws.
// - Its forward must be a single, non-template member (Linear's, a block's): the wrapper
//   has the same signature, so it fits a Sequential.
// - Move the model to its device and dtype before sharding: afterwards its parameters are
//   views of the unit's flat buffer (Note [Parameters over a flat buffer] in fsdp_unit.cc),
//   which module->to() would replace.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "datapar/fsdp/fsdp_options.h"
#include "datapar/nn/wrap_each.h"
#include "datapar/process_group/process_group.h"

namespace datapar {
namespace detail {

class FsdpUnit;

// Registered among a sharded module's children ("_fsdp_unit"): owns its unit, so that a
// module sharded in place (fully_shard(net->fc1)) keeps it, and the root finds it.
class FsdpUnitHandle : public torch::nn::Module {
 public:
  explicit FsdpUnitHandle(std::shared_ptr<FsdpUnit> unit);
  ~FsdpUnitHandle() override;
  const std::shared_ptr<FsdpUnit>& unit() const { return unit_; }

 private:
  std::shared_ptr<FsdpUnit> unit_;
};

// The name of the FSDP unit whose flat buffer `tensor` is a view of (a parameter of a
// sharded module), or "" if none: whatever reads a module's parameters whole checks it.
std::string fsdp_unit_holding(const at::Tensor& tensor);

// The unit `module` was made into by fully_shard, if any.
std::shared_ptr<FsdpUnit> unit_of(const torch::nn::Module& module);

// Makes `module` a unit in place (collective): shards its parameters (those of units inside
// it excepted) and registers the unit's handle among its children. Throws if it is a unit
// already or a unit holds its parameters.
std::shared_ptr<FsdpUnit> shard_in_place(torch::nn::Module& module, std::shared_ptr<ProcessGroup> group,
                                         const FsdpOptions& options);

// The non-template part of a unit's module: what a FullyShardedDataParallel root finds when
// it walks the model.
class ShardedModule : public WrapperModule {
 public:
  ~ShardedModule() override;
  FsdpUnit& unit() const { return *unit_; }

 protected:
  ShardedModule(std::shared_ptr<torch::nn::Module> wrapped, std::shared_ptr<ProcessGroup> group, FsdpOptions options);
  void pre_forward();
  void post_forward(const c10::IValue& outputs);

 private:
  std::shared_ptr<FsdpUnit> unit_;
};

// The trainable parameters of `module` and its submodules, except those of units inside it.
std::vector<at::Tensor> unit_parameters(const torch::nn::Module& module);
// Its buffers, likewise.
std::vector<at::Tensor> unit_buffers(const torch::nn::Module& module);

}  // namespace detail

namespace detail {

// M's forward, taking A... and returning R, with M's parameters gathered for it.
template <typename M, typename R, typename... A>
class ShardedForward : public ShardedModule {
 public:
  ShardedForward(std::shared_ptr<M> module, std::shared_ptr<ProcessGroup> group, FsdpOptions options)
      : ShardedModule(module, std::move(group), options), module_(std::move(module)) {}

  R forward(A... args) {
    pre_forward();
    R output = module_->forward(std::forward<A>(args)...);
    post_forward(c10::IValue(output));  // the same tensors: hooks set on them are the caller's
    return output;
  }

  const std::shared_ptr<M>& module() const { return module_; }

 private:
  std::shared_ptr<M> module_;
};

}  // namespace detail

// A unit: M with the forward of M's signature (C: the class that declares it, M or a base of
// M, as BatchNorm2dImpl's), so that it fits where M did.
template <typename M, typename Forward = decltype(&M::forward)>
class ShardedImpl;

template <typename M, typename C, typename R, typename... A>
class ShardedImpl<M, R (C::*)(A...)> : public detail::ShardedForward<M, R, A...> {
 public:
  ShardedImpl(std::shared_ptr<M> module, std::shared_ptr<ProcessGroup> group, FsdpOptions options = {})
      : detail::ShardedForward<M, R, A...>(std::move(module), std::move(group), options) {}
};

template <typename M, typename C, typename R, typename... A>
class ShardedImpl<M, R (C::*)(A...) const> : public detail::ShardedForward<M, R, A...> {
 public:
  ShardedImpl(std::shared_ptr<M> module, std::shared_ptr<ProcessGroup> group, FsdpOptions options = {})
      : detail::ShardedForward<M, R, A...>(std::move(module), std::move(group), options) {}
};

// `module` as a unit (collective: every rank, same module, same order).
// group: the ranks to shard over, the root's (default: datapar::default_group()).
template <typename M>
std::shared_ptr<ShardedImpl<M>> fully_shard(std::shared_ptr<M> module, std::shared_ptr<ProcessGroup> group = nullptr,
                                            FsdpOptions options = {}) {
  return std::make_shared<ShardedImpl<M>>(std::move(module), std::move(group), options);
}

template <typename M>
std::shared_ptr<ShardedImpl<M>> fully_shard(const torch::nn::ModuleHolder<M>& module,
                                            std::shared_ptr<ProcessGroup> group = nullptr, FsdpOptions options = {}) {
  return fully_shard(module.ptr(), std::move(group), options);
}

namespace detail {

// Makes each module of `root`'s tree (root itself excepted) that is none of the units made
// so far nor inside one, and for which `pick` says yes, a unit in place (shard_in_place),
// top-down. Returns how many.
int shard_in_place_where(torch::nn::Module& root, const std::function<bool(const torch::nn::Module&)>& pick,
                         const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& options);

}  // namespace detail

// Makes each module of type Units (Impl types: models::ResidualImpl, torch::nn::LinearImpl)
// in `root`'s tree a unit (as PyTorch's ModuleWrapPolicy), on any tree:
//   fully_shard_each<torch::nn::LinearImpl>(*net, group);
// The elements of Sequentials are replaced by units that bracket their forward (innermost
// Sequentials first); then the other modules of those types (named members, a ResNet's
// stem) that are not inside a unit already are sharded in place, outermost first (see
// fully_shard above for how those are gathered). Collective: every rank, same model.
// Returns how many units it made.
template <typename... Units>
int fully_shard_each(torch::nn::Module& root, std::shared_ptr<ProcessGroup> group = nullptr, FsdpOptions options = {}) {
  const int in_sequentials =
      detail::wrap_each<Units...>(root, [&](auto module) { return fully_shard(std::move(module), group, options); });
  const auto pick = [](const torch::nn::Module& module) {
    return ((dynamic_cast<const Units*>(&module) != nullptr) || ...);
  };
  return in_sequentials + detail::shard_in_place_where(root, pick, group, options);
}

}  // namespace datapar
