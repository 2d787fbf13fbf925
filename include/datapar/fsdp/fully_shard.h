// Units of fully sharded data parallelism: a submodule whose parameters are gathered just
// before its forward and freed after, so that only one unit (and the ones prefetched) is
// whole at a time, as PyTorch's fully_shard(submodule) does.
//
//   models::ResNet18 model;
//   datapar::fully_shard_each<models::ResidualImpl>(*model, group);  // each block a unit
//   datapar::FullyShardedDataParallel fsdp(model, group);             // the root: the rest
//
// PyTorch registers forward hooks on the submodule; libtorch modules have none, so a unit
// is a module that wraps the submodule and brackets its forward: ShardedImpl<M> (made by
// fully_shard(), or in place inside Sequentials by fully_shard_each()). The wrapper lists
// the submodule's own parameters, buffers and children under their own names, so the
// model's parameter and state-dict names stay those of the unwrapped model ("layers.0.weight",
// never "layers.0.module.weight").
//
// - A unit shards its parameters when it is made (every rank takes rank 0's values); it
//   trains only under a FullyShardedDataParallel root made afterwards over the whole model.
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

#include <memory>
#include <utility>
#include <vector>

#include "datapar/fsdp/fsdp_options.h"
#include "datapar/nn/wrap_each.h"
#include "datapar/process_group/process_group.h"

namespace datapar {
namespace detail {

class FsdpUnit;

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

// Makes each element of type Units (Impl types: models::ResidualImpl, torch::nn::LinearImpl)
// of every Sequential in `root`'s tree a unit, in place (as PyTorch's ModuleWrapPolicy):
//   fully_shard_each<torch::nn::LinearImpl>(*mlp, group);
// Members called outside a Sequential (a ResNet's stem) stay with the root. Collective:
// every rank, same model. Returns how many units it made.
template <typename... Units>
int fully_shard_each(torch::nn::Module& root, std::shared_ptr<ProcessGroup> group = nullptr, FsdpOptions options = {}) {
  return detail::wrap_each<Units...>(root, [&](auto module) { return fully_shard(std::move(module), group, options); });
}

}  // namespace datapar
