// DistributedDataParallel: PyTorch's DDP for libtorch modules. One process per device; each
// process runs the whole module on its own batch, and backward all-reduces the gradients in
// buckets while it is still running, so every rank ends with the same averaged gradients.
//
//   datapar::init_process_group("gloo");                 // e.g. under `datapar launch`
//   auto model = std::make_shared<Net>();
//   datapar::DistributedDataParallel ddp(model);         // checks and broadcasts the model
//   torch::optim::SGD sgd(ddp.parameters(), 0.1);
//   for (auto& [x, y] : my_shard) {
//     sgd.zero_grad();
//     torch::nll_loss(ddp.forward(x), y).backward();     // gradients averaged over ranks
//     sgd.step();
//   }
//
// Semantics to know:
// - Construction is a collective: every rank must construct DDP together. It checks that all
//   ranks hold the same parameters and buffers (names, shapes, dtypes; a mismatch throws on
//   every rank naming the first difference) and copies rank 0's values to everyone.
// - forward() with grad enabled broadcasts rank 0's buffers first (broadcast_buffers; a
//   forward without grad, e.g. evaluation on rank 0 alone, is local), and decides whether the
//   following backward synchronises: inside a no_sync() scope it does not, and gradients
//   accumulate locally until the first backward after a forward outside the scope.
// - Averaging: by world size (PyTorch's), or by samples (average_by_samples): each rank's
//   gradient weighs by its batch size, so uneven batches give exactly the gradient of one
//   process on their concatenation when the loss is a mean over the batch. The sample count
//   is dim 0 of forward's first tensor argument unless set_samples() overrides it.
// - Every parameter that requires a gradient must get one in every synchronised backward,
//   unless find_unused_parameters is set (then the graph is searched after each forward).
// - Names: parameters(), named_parameters() and state_dict() are the module's, without a
//   "module." prefix.
// - Not thread-safe: one forward/backward at a time.
#pragma once

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "datapar/ddp/comm_hook.h"
#include "datapar/ddp/communication_stats.h"
#include "datapar/error.h"
#include "datapar/parallel/leading_rows.h"
#include "datapar/process_group/process_group.h"
#include "datapar/state_dict.h"

namespace datapar {

struct DdpOptions {
  // Gradients travel in buckets of about this size; the first bucket, reduced while most
  // of backward still runs, is smaller.
  double bucket_cap_mb = 25;
  double first_bucket_cap_mb = 1;
  // Broadcast rank 0's buffers (e.g. BatchNorm running statistics) before each forward with
  // grad enabled, as PyTorch does.
  bool broadcast_buffers = true;
  // Search the autograd graph after each forward for parameters the loss does not depend
  // on, and treat their gradient as zero (costs a graph walk and a small all-reduce).
  bool find_unused_parameters = false;
  // Make .grad views into the buckets: no copy in or out, less memory.
  bool gradient_as_bucket_view = false;
  // Weigh each rank's gradient by its sample count instead of dividing by world size.
  bool average_by_samples = false;
  // No timeout of its own: DDP waits within its group's (ProcessGroup::timeout()), as
  // PyTorch's DDP does.
};

namespace detail {

// The non-template part of DistributedDataParallel.
class DdpCore {
 public:
  DdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group, DdpOptions options);
  ~DdpCore();

  void pre_forward(int64_t samples);
  void post_forward(const c10::IValue& outputs);
  void set_samples(int64_t samples) { samples_override_ = samples; }
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  void set_comm_hook(std::shared_ptr<CommHook> hook);
  void join(const std::function<void()>& train);
  std::vector<std::vector<size_t>> bucket_indices() const;
  CommunicationStats communication_stats() const;

  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  const DdpOptions& options() const { return options_; }

 private:
  class Impl;
  void broadcast_buffers();  // rank 0's buffers to everyone, if the options ask for it

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::unique_ptr<Impl> impl_;
  bool sync_ = true;
  int64_t samples_override_ = -1;
};

}  // namespace detail

template <typename ModuleImpl>
class DistributedDataParallel {
 public:
  // group: the ranks to synchronise over (default: datapar::default_group()).
  DistributedDataParallel(std::shared_ptr<ModuleImpl> module, std::shared_ptr<ProcessGroup> group = nullptr,
                          DdpOptions options = {})
      : module_(std::move(module)),
        core_(std::make_shared<detail::DdpCore>(module_, std::move(group), std::move(options))) {}

  DistributedDataParallel(const torch::nn::ModuleHolder<ModuleImpl>& module,
                          std::shared_ptr<ProcessGroup> group = nullptr, DdpOptions options = {})
      : DistributedDataParallel(module.ptr(), std::move(group), std::move(options)) {}

  // Runs the module's forward on this rank's inputs; see the header comment for what it
  // synchronises.
  template <typename... Args>
  auto forward(Args&&... args) {
    core_->pre_forward(detail::leading_rows(args...));
    auto output = module_->forward(std::forward<Args>(args)...);
    if (at::GradMode::is_enabled()) core_->post_forward(c10::IValue(output));
    return output;
  }

  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // A scope in which forwards do not synchronise their backward (gradient accumulation):
  //   { auto guard = ddp.no_sync(); ddp.forward(x1).sum().backward(); }
  //   ddp.forward(x2).sum().backward();  // all-reduces the sum of both micro-batches
  class NoSync {
   public:
    explicit NoSync(std::shared_ptr<detail::DdpCore> core) : core_(std::move(core)), before_(core_->sync()) {
      core_->set_sync(false);
    }
    ~NoSync() { core_->set_sync(before_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    std::shared_ptr<detail::DdpCore> core_;
    bool before_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(core_); }

  // Uneven inputs: runs `train` (this rank's loop over its batches); a rank whose loop ends
  // early keeps matching the others' collectives with zero contributions until every
  // rank's loop has ended, so nobody hangs. Afterwards all ranks hold the parameters and
  // buffers of the rank that trained longest. Average by samples to keep the gradient
  // exact while some ranks have stopped.
  void join(const std::function<void()>& train) { core_->join(train); }

  // The sample count of the next backward, instead of dim 0 of forward's first tensor.
  void set_samples(int64_t samples) { core_->set_samples(samples); }

  // Replaces how buckets are reduced (see comm_hook.h).
  void register_comm_hook(std::shared_ptr<CommHook> hook) { core_->set_comm_hook(std::move(hook)); }

  const std::shared_ptr<ModuleImpl>& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return core_->group(); }
  const DdpOptions& options() const { return core_->options(); }

  // Parameter indices (into parameters()) of each bucket, in reduction order.
  std::vector<std::vector<size_t>> bucket_indices() const { return core_->bucket_indices(); }

  // Since construction, on this rank (compare with the same bytes all-reduced alone to
  // get the share hidden behind backward, as `datapar bench ddp` does).
  CommunicationStats communication_stats() const { return core_->communication_stats(); }

  std::vector<at::Tensor> parameters(bool recurse = true) const { return module_->parameters(recurse); }
  torch::OrderedDict<std::string, at::Tensor> named_parameters(bool recurse = true) const {
    return module_->named_parameters(recurse);
  }
  std::vector<at::Tensor> buffers(bool recurse = true) const { return module_->buffers(recurse); }
  StateDict state_dict() const { return datapar::state_dict(*module_); }
  void load_state_dict(const StateDict& state, bool strict = true) { datapar::load_state_dict(*module_, state, strict); }

  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  bool is_training() const { return module_->is_training(); }
  void zero_grad(bool set_to_none = true) { module_->zero_grad(set_to_none); }

 private:
  std::shared_ptr<ModuleImpl> module_;
  std::shared_ptr<detail::DdpCore> core_;
};

template <typename ModuleImpl>
DistributedDataParallel(std::shared_ptr<ModuleImpl>) -> DistributedDataParallel<ModuleImpl>;
template <typename ModuleImpl>
DistributedDataParallel(std::shared_ptr<ModuleImpl>, std::shared_ptr<ProcessGroup>)
    -> DistributedDataParallel<ModuleImpl>;
template <typename ModuleImpl>
DistributedDataParallel(std::shared_ptr<ModuleImpl>, std::shared_ptr<ProcessGroup>, DdpOptions)
    -> DistributedDataParallel<ModuleImpl>;

}  // namespace datapar
