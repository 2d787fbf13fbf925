// ReplicaSet: building replicas and keeping them in step with the master.
#include "datapar/parallel/replicate.h"

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>

#include "parallel/device_workers.h"
#include "tensor/coalesce.h"

namespace datapar {
namespace detail {
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

// Copies `master`'s values into `replica` on `device`: in place where shape and dtype
// allow (the replica keeps its memory), else into new memory of its own (never the
// master's, even on the master's device).
// Written through variable_data(), which shares the memory but not the version counter:
// the graph of an earlier forward that saved this replica's parameters (two forwards
// before one backward, retain_graph) must stay usable, as with shared replicas, which
// the optimizer also writes through p.data().
// Non-blocking only towards CUDA: a CPU replica of a CUDA master (unlike devices) reads its
// copy on its own thread right away.
void copy_into(at::Tensor& replica, const at::Tensor& master, const c10::Device& device) {
  if (replica.is_same_size(master) && replica.dtype() == master.dtype() && replica.data_ptr() != master.data_ptr()) {
    replica.variable_data().copy_(master, /*non_blocking=*/device.is_cuda());
  } else {
    replica.set_data(master.to(device, master.scalar_type(), /*non_blocking=*/false, /*copy=*/true));
  }
}

}  // namespace
}  // namespace detail

const char* to_string(ReplicaStorage storage) { return storage == ReplicaStorage::kShared ? "shared" : "copy"; }

namespace detail {

ReplicaSet::ReplicaSet(std::shared_ptr<torch::nn::Module> master, std::vector<Device> devices, ReplicaStorage storage)
    : master_(std::move(master)), devices_(std::move(devices)), storage_(storage) {
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
    replica_modules_.push_back(replica->modules(/*include_self=*/true));
    replicas_.push_back(std::move(replica));
  }
  // Note [One copy per replica]
  bool copies = false;
  for (size_t r = 0; r < replicas_.size(); ++r) {
    for (const at::Tensor& p : master_params_) {
      if (!shares(r, p)) {
        detail::pack_back_to_back(replica_params_[r]);
        copies = true;
        break;
      }
    }
  }
  if (copies) detail::pack_back_to_back(master_params_);
  // DataParallel and replicate(), the public entry points here, have no setting for pinning:
  // read at their boundary (docs/launching.md, "Environment variables").
  workers_ = DeviceWorkers::for_devices(devices_, pin_cpu_devices(process_environment()));
  refresh();
}

ReplicaSet::~ReplicaSet() = default;

bool ReplicaSet::shares(size_t r, const at::Tensor& master) const {
  return master.device() == devices_[r].torch_device() && (storage_ == ReplicaStorage::kShared || r == 0);
}

// Note [Refreshing copies every forward]
// A copy is refreshed from the master before every forward, as PyTorch's DataParallel
// replicates before every forward. Cheaper rules are not safe: libtorch's optimizers and
// hand-written loops update through p.data(), which shares the master's memory but not its
// version counter, and a user may point a parameter at new memory (set_data) or load a
// state dict at any time. What it costs is one copy of the parameters per extra device and
// forward, which each replica's own thread makes just before its forward (parallel_apply),
// so that the copies of several devices run side by side: docs/benchmarks.md measures it.
void ReplicaSet::refresh() {
  refresh_shared();
  for (size_t r = 0; r < replicas_.size(); ++r) refresh_copies(r);
}

void ReplicaSet::refresh_shared() {
  at::NoGradGuard no_grad;
  // Taken again every time: parameters the user replaced must be the ones trained.
  std::vector<at::Tensor> params = master_->parameters(/*recurse=*/true);
  DATAPAR_CHECK(params.size() == master_params_.size(), "replicate: ", master_->name(), " now has ", params.size(),
                " parameters but had ", master_params_.size(),
                " when it was replicated. Replicate it again after changing its structure.");
  master_params_ = std::move(params);
  master_buffers_ = master_->buffers();
  DATAPAR_CHECK(master_buffers_.size() == replica_buffers_.front().size(), "replicate: ", master_->name(), " now has ",
                master_buffers_.size(), " buffers but had ", replica_buffers_.front().size(),
                " when it was replicated. Replicate it again after changing its structure.");
  for (size_t r = 0; r < replicas_.size(); ++r) {
    // Train/eval per submodule, parents first: Module::train() recurses into children.
    const auto& replica_modules = replica_modules_[r];
    for (size_t m = 0; m < master_modules_.size() && m < replica_modules.size(); ++m) {
      if (replica_modules[m]->is_training() != master_modules_[m]->is_training()) {
        replica_modules[m]->train(master_modules_[m]->is_training());
      }
    }
    for (size_t j = 0; j < master_params_.size(); ++j) {
      const at::Tensor& master = master_params_[j];
      at::Tensor& replica = replica_params_[r][j];
      // A separate leaf over the master's storage.
      if (shares(r, master) && (replica.data_ptr() != master.data_ptr() || !replica.is_same_size(master) ||
                                replica.strides() != master.strides() || replica.dtype() != master.dtype())) {
        replica.set_data(master);
      }
      if (replica.requires_grad() != master.requires_grad()) replica.requires_grad_(master.requires_grad());
    }
    // Buffers here, not on the replicas' threads: replica 0's forward updates the master's
    // buffers it shares (BatchNorm's running statistics) while the others would read them.
    const c10::Device device = devices_[r].torch_device();
    for (size_t j = 0; j < master_buffers_.size(); ++j) {
      const at::Tensor& master = master_buffers_[j];
      at::Tensor& replica = replica_buffers_[r][j];
      if (!master.defined() || !replica.defined()) continue;
      if (r == 0 && shares(r, master)) {
        if (replica.data_ptr() != master.data_ptr()) replica.set_data(master);
      } else {
        // Other replicas update their own copy (their running statistics are discarded).
        copy_into(replica, master, device);
      }
    }
  }
}

// Note [One copy per replica]
// Where a replica holds copies, its parameters and the master's are each packed back to
// back in one buffer per dtype when the replicas are made (coalesce.h), so that a refresh
// is one copy per dtype and replica, not one per parameter: on GPUs one transfer instead of
// a launch per tensor (62 for ResNet-18). The master's parameters keep their Tensor objects
// and values; their memory moves once, there. A parameter the user points elsewhere later
// (set_data, a loaded state dict of another shape) unpacks its dtype: that replica's
// refresh copies parameter by parameter again, as before.
bool ReplicaSet::copy_packed(size_t r, const c10::Device& device) {
  for (const at::Tensor& master : master_params_) {
    if (shares(r, master)) return false;
  }
  const std::vector<FlatGroup> from = views_by_dtype(master_params_);
  const std::vector<FlatGroup> to = views_by_dtype(replica_params_[r]);
  if (from.size() != to.size()) return false;
  for (size_t g = 0; g < from.size(); ++g) {
    if (!from[g].aliases || !to[g].aliases || from[g].members != to[g].members) return false;
    for (size_t j : from[g].members) {
      if (!master_params_[j].is_same_size(replica_params_[r][j])) return false;
    }
  }
  for (size_t g = 0; g < from.size(); ++g) to[g].flat.copy_(from[g].flat, /*non_blocking=*/device.is_cuda());
  return true;
}

void ReplicaSet::refresh_copies(size_t r) {
  at::NoGradGuard no_grad;  // thread-local: this may run on replica r's thread
  const c10::Device device = devices_[r].torch_device();
  if (copy_packed(r, device)) {  // Note [One copy per replica]
    parameter_copies_.fetch_add(static_cast<int64_t>(master_params_.size()), std::memory_order_relaxed);
    return;
  }
  int64_t copies = 0;
  for (size_t j = 0; j < master_params_.size(); ++j) {
    const at::Tensor& master = master_params_[j];
    if (shares(r, master)) continue;
    copy_into(replica_params_[r][j], master, device);  // Note [Refreshing copies every forward]
    ++copies;
  }
  parameter_copies_.fetch_add(copies, std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace datapar
