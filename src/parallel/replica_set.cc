// ReplicaSet: building replicas and keeping them in step with the master.
#include "datapar/parallel/replicate.h"

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>


#include "parallel/device_workers.h"

namespace datapar::detail {
namespace {

// Module::clone() runs reset(), which draws fresh initial weights from the global CPU
// generator before the master's values are copied in. Put the generator back afterwards.
std::shared_ptr<torch::nn::Module> clone_keeping_rng(const torch::nn::Module& master,
                                                     const c10::Device& device) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor saved = generator.get_state();
  std::shared_ptr<torch::nn::Module> copy;
  try {
    copy = master.clone(device);
  } catch (const c10::Error& e) {
    throw InvalidArgumentError(str_cat(
        "replicate: cannot clone ", master.name(), ": ", e.what_without_backtrace(),
        " Derive the module from torch::nn::Cloneable<", master.name(),
        "> and register its parameters, buffers and submodules in reset()."));
  }
  generator.set_state(saved);
  return copy;
}

}  // namespace

ReplicaSet::ReplicaSet(std::shared_ptr<torch::nn::Module> master, std::vector<Device> devices)
    : master_(std::move(master)), devices_(std::move(devices)) {
  DATAPAR_CHECK(!devices_.empty(), "replicate: no devices given; list at least one device.");
  master_params_ = master_->parameters(/*recurse=*/true);
  master_buffers_ = master_->buffers();
  master_modules_ = master_->modules(/*include_self=*/true);
  const c10::Device home = devices_.front().torch_device();
  for (const auto& p : master_->named_parameters()) {
    DATAPAR_CHECK(p.value().device() == home, "replicate: parameter ", p.key(), " of ", master_->name(),
                  " is on ", p.value().device(), " but the first device is ", devices_.front(),
                  ". Move the module there first (module->to(", home, ")).");
  }
  for (const Device& device : devices_) {
    auto replica = clone_keeping_rng(*master_, device.torch_device());
    replica_params_.push_back(replica->parameters(/*recurse=*/true));
    replica_buffers_.push_back(replica->buffers());
    DATAPAR_INTERNAL_ASSERT(replica_params_.back().size() == master_params_.size(),
                            "clone of ", master_->name(), " has a different parameter count");
    synced_.emplace_back(master_params_.size());
    replica_modules_.push_back(replica->modules(/*include_self=*/true));
    replicas_.push_back(std::move(replica));
  }
  workers_ = DeviceWorkers::for_devices(devices_);
  refresh();
}

ReplicaSet::~ReplicaSet() = default;

void ReplicaSet::refresh() {
  at::NoGradGuard no_grad;
  DATAPAR_CHECK(master_->parameters().size() == master_params_.size(), "replicate: ", master_->name(),
                " now has ", master_->parameters().size(), " parameters but had ", master_params_.size(),
                " when it was replicated. Replicate it again after changing its structure.");
  const auto& master_modules = master_modules_;
  for (size_t r = 0; r < replicas_.size(); ++r) {
    // Train/eval per submodule, parents first: Module::train() recurses into children.
    const auto& replica_modules = replica_modules_[r];
    for (size_t m = 0; m < master_modules.size() && m < replica_modules.size(); ++m) {
      if (replica_modules[m]->is_training() != master_modules[m]->is_training()) {
        replica_modules[m]->train(master_modules[m]->is_training());
      }
    }
    const c10::Device device = devices_[r].torch_device();
    for (size_t j = 0; j < master_params_.size(); ++j) {
      const at::Tensor& master = master_params_[j];
      at::Tensor& replica = replica_params_[r][j];
      if (master.device() == device) {
        // Same device: a separate leaf over the master's storage.
        if (replica.data_ptr() != master.data_ptr() || !replica.is_same_size(master) ||
            replica.strides() != master.strides() || replica.dtype() != master.dtype()) {
          replica.set_data(master);
        }
      } else {
        Synced& synced = synced_[r][j];
        if (synced.version != static_cast<int64_t>(master._version()) || synced.data != master.data_ptr()) {
          if (replica.is_same_size(master) && replica.dtype() == master.dtype()) {
            replica.copy_(master, /*non_blocking=*/true);
          } else {
            replica.set_data(master.to(device));
          }
          synced.version = static_cast<int64_t>(master._version());
          synced.data = master.data_ptr();
          ++parameter_copies_;
        }
      }
      if (replica.requires_grad() != master.requires_grad()) replica.requires_grad_(master.requires_grad());
    }
    for (size_t j = 0; j < master_buffers_.size(); ++j) {
      const at::Tensor& master = master_buffers_[j];
      at::Tensor& replica = replica_buffers_[r][j];
      if (!master.defined() || !replica.defined()) continue;
      if (r == 0 && master.device() == device) {
        if (replica.data_ptr() != master.data_ptr()) replica.set_data(master);
      } else {
        // Other replicas update their own copy (their running statistics are discarded).
        if (replica.is_same_size(master) && replica.dtype() == master.dtype()) {
          replica.copy_(master, /*non_blocking=*/true);
        } else {
          replica.set_data(master.to(device));
        }
      }
    }
  }
}

}  // namespace datapar::detail
