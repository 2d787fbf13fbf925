// replicate: one copy of a module per device, kept in step with the original (the master).
//
// A replica's parameters are autograd leaves of its own, so replicas running side by side
// never race on .grad; parallel_apply routes their gradients back to the master's
// parameters. Where a replica lives on the master's device (every CPU device, or the CUDA
// device the master sits on), its parameters share the master's storage: no copy
// (ReplicaStorage::kShared). On other CUDA devices, and on every device but the first with
// ReplicaStorage::kCopy, they are copies, refreshed from the master before every forward,
// as PyTorch replicates before every forward (Note [Refreshing copies every forward]).
// Buffers (BatchNorm's running statistics) come from the master before every forward; the
// first replica shares the master's buffers when it can, so running statistics are those
// of the first replica's chunk, as in PyTorch.
//
// The module type must be clonable: derive from torch::nn::Cloneable<YourModuleImpl> (all
// of torch::nn's modules do) and register parameters, buffers and submodules in reset().
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "datapar/devices.h"
#include "datapar/error.h"

namespace datapar {

// How replicas on the master's device get the master's parameters.
enum class ReplicaStorage {
  kShared,  // they share the master's storage: no copies (the default)
  kCopy,    // every replica but the first holds a copy, as replicas on other GPUs must
};

const char* to_string(ReplicaStorage storage);

namespace detail {

class DeviceWorkers;

// The master, one replica per device, and how their tensors relate. Not a public type:
// use replicate() / DataParallel. Not thread-safe: one forward at a time.
class ReplicaSet {
 public:
  // Clones `master` once per device (keeping the global CPU random state unchanged, so that
  // building replicas does not change what the program draws next).
  ReplicaSet(std::shared_ptr<torch::nn::Module> master, std::vector<Device> devices,
             ReplicaStorage storage = ReplicaStorage::kShared);
  ~ReplicaSet();

  // Brings every replica up to date with the master: train/eval mode, parameters (shared,
  // or copied) and buffers. Parameters the user replaced in the master are picked up.
  // The same as refresh_shared() and then refresh_copies(r) for every replica.
  void refresh();
  // What must happen on the calling thread first: the master's current parameters, modes,
  // the replicas that share the master's memory, and every replica's buffers.
  void refresh_shared();
  // Replica r's copies of the master's parameters (none where it shares them).
  // Safe to run for different replicas on different threads, after refresh_shared().
  void refresh_copies(size_t r);

  size_t size() const { return replicas_.size(); }
  const std::vector<Device>& devices() const { return devices_; }
  ReplicaStorage storage() const { return storage_; }
  const std::shared_ptr<torch::nn::Module>& master() const { return master_; }
  const std::shared_ptr<torch::nn::Module>& replica(size_t i) const { return replicas_.at(i); }

  // All parameters, master (as of the last refresh) and replica i, in the same
  // (registration) order.
  const std::vector<at::Tensor>& master_parameters() const { return master_params_; }
  const std::vector<at::Tensor>& replica_parameters(size_t i) const { return replica_params_.at(i); }

  // Parameter tensors copied between devices so far (shared parameters never count).
  int64_t parameter_copies() const { return parameter_copies_.load(std::memory_order_relaxed); }

  DeviceWorkers& workers() const { return *workers_; }
  const std::shared_ptr<DeviceWorkers>& workers_ptr() const { return workers_; }

 private:
  // Whether replica r's parameters share the master's storage.
  bool shares(size_t r, const at::Tensor& master) const;
  // Note [One copy per replica]: copies every parameter of the master into replica r with
  // one copy per dtype; false, having copied nothing, where they do not lie back to back.
  bool copy_packed(size_t r, const c10::Device& device);

  std::shared_ptr<torch::nn::Module> master_;
  std::vector<Device> devices_;
  ReplicaStorage storage_;
  std::vector<std::shared_ptr<torch::nn::Module>> replicas_;
  std::vector<at::Tensor> master_params_;
  std::vector<at::Tensor> master_buffers_;
  std::vector<std::vector<at::Tensor>> replica_params_;
  std::vector<std::vector<at::Tensor>> replica_buffers_;
  // Every module of the tree, parents first, in the same order for master and replicas
  // (built once: the structure must not change after replication).
  std::vector<std::shared_ptr<torch::nn::Module>> master_modules_;
  std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> replica_modules_;
  std::atomic<int64_t> parameter_copies_{0};
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
Replicas<ModuleImpl> replicate(const std::shared_ptr<ModuleImpl>& module, const std::vector<Device>& devices,
                               ReplicaStorage storage = ReplicaStorage::kShared) {
  DATAPAR_CHECK(module != nullptr, "replicate: the module is null.");
  return Replicas<ModuleImpl>(std::make_shared<detail::ReplicaSet>(module, devices, storage));
}

template <typename ModuleImpl>
Replicas<ModuleImpl> replicate(const torch::nn::ModuleHolder<ModuleImpl>& module, const std::vector<Device>& devices,
                               ReplicaStorage storage = ReplicaStorage::kShared) {
  return replicate(module.ptr(), devices, storage);
}

}  // namespace datapar
