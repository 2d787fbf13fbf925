// replicate: one copy of a module per device, kept in step with the original (the master).
//
// A replica's parameters are autograd leaves of its own, so replicas running side by side
// never race on .grad; parallel_apply routes their gradients back to the master's
// parameters. Where a replica lives on the master's device (every CPU device, or the CUDA
// device the master sits on), its parameters share the master's storage: no copy. On other
// CUDA devices they are copies, refreshed before a forward only when the master's
// parameters changed since the last copy (tensor version counters), not on every forward.
// Buffers (BatchNorm's running statistics) come from the master before every forward; the
// first replica shares the master's buffers when it can, so running statistics are those
// of the first replica's chunk, as in PyTorch.
//
// The module type must be clonable: derive from torch::nn::Cloneable<YourModuleImpl> (all
// of torch::nn's modules do) and register parameters, buffers and submodules in reset().
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "datapar/devices.h"
#include "datapar/error.h"

namespace datapar {
namespace detail {

class DeviceWorkers;

// The master, one replica per device, and how their tensors relate. Not a public type:
// use replicate() / DataParallel. Not thread-safe: one forward at a time.
class ReplicaSet {
 public:
  // Clones `master` once per device (keeping the global CPU random state unchanged, so that
  // building replicas does not change what the program draws next).
  ReplicaSet(std::shared_ptr<torch::nn::Module> master, std::vector<Device> devices);
  ~ReplicaSet();

  // Brings every replica up to date with the master: train/eval mode, parameters (shared
  // or, on another device, copied if the master's version changed), buffers (always).
  void refresh();

  size_t size() const { return replicas_.size(); }
  const std::vector<Device>& devices() const { return devices_; }
  const std::shared_ptr<torch::nn::Module>& master() const { return master_; }
  const std::shared_ptr<torch::nn::Module>& replica(size_t i) const { return replicas_.at(i); }

  // All parameters, master and replica i, in the same (registration) order.
  const std::vector<at::Tensor>& master_parameters() const { return master_params_; }
  const std::vector<at::Tensor>& replica_parameters(size_t i) const { return replica_params_.at(i); }

  // Parameter tensors copied between devices so far (shared parameters never count).
  int64_t parameter_copies() const { return parameter_copies_; }

  DeviceWorkers& workers() const { return *workers_; }
  const std::shared_ptr<DeviceWorkers>& workers_ptr() const { return workers_; }

 private:
  std::shared_ptr<torch::nn::Module> master_;
  std::vector<Device> devices_;
  std::vector<std::shared_ptr<torch::nn::Module>> replicas_;
  std::vector<at::Tensor> master_params_;
  std::vector<at::Tensor> master_buffers_;
  std::vector<std::vector<at::Tensor>> replica_params_;
  std::vector<std::vector<at::Tensor>> replica_buffers_;
  // Every module of the tree, parents first, in the same order for master and replicas
  // (built once: the structure must not change after replication).
  std::vector<std::shared_ptr<torch::nn::Module>> master_modules_;
  std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> replica_modules_;
  // Per replica and parameter: the master's version and storage when last copied.
  struct Synced {
    int64_t version = -1;
    const void* data = nullptr;
  };
  std::vector<std::vector<Synced>> synced_;
  int64_t parameter_copies_ = 0;
  std::shared_ptr<DeviceWorkers> workers_;
};

}  // namespace detail

// The replicas of one module, one per device, usable like a vector of module pointers:
// replicas[i] is the replica on devices()[i].
template <typename ModuleImpl>
class Replicas {
 public:
  Replicas(std::shared_ptr<detail::ReplicaSet> set) : set_(std::move(set)) {
    for (size_t i = 0; i < set_->size(); ++i) {
      typed_.push_back(std::dynamic_pointer_cast<ModuleImpl>(set_->replica(i)));
      DATAPAR_INTERNAL_ASSERT(typed_.back() != nullptr, "replica ", i, " has the wrong type");
    }
  }

  size_t size() const { return typed_.size(); }
  const std::shared_ptr<ModuleImpl>& operator[](size_t i) const { return typed_[i]; }
  auto begin() const { return typed_.begin(); }
  auto end() const { return typed_.end(); }
  const std::vector<Device>& devices() const { return set_->devices(); }

  detail::ReplicaSet& set() const { return *set_; }

 private:
  std::shared_ptr<detail::ReplicaSet> set_;
  std::vector<std::shared_ptr<ModuleImpl>> typed_;
};

// One replica of `module` per device. The master must live on devices[0]'s torch device.
// Throws InvalidArgumentError for no devices, a module that cannot be cloned, or a master
// on another device.
template <typename ModuleImpl>
Replicas<ModuleImpl> replicate(const std::shared_ptr<ModuleImpl>& module, const std::vector<Device>& devices) {
  DATAPAR_CHECK(module != nullptr, "replicate: the module is null.");
  return Replicas<ModuleImpl>(std::make_shared<detail::ReplicaSet>(module, devices));
}

template <typename ModuleImpl>
Replicas<ModuleImpl> replicate(const torch::nn::ModuleHolder<ModuleImpl>& module,
                               const std::vector<Device>& devices) {
  return replicate(module.ptr(), devices);
}

}  // namespace datapar
