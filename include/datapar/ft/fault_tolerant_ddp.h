// FaultTolerantDdp: DDP training that goes on when a member dies, hangs or joins (issue 31,
// docs/fault_tolerance.md). Each step is committed only if every live member finished its
// collectives for it; a failed step is trained again over the new membership, from the
// survivors' in-memory state (no checkpoint is read), and a member that (re)joins takes the
// model, optimizer state and step from a member at the newest step.
//
//   ft::ElasticGroup elastic(store, "run", options, [](auto store, int rank, int size) {
//     return datapar::new_gloo_process_group(store, rank, size);
//   });
//   auto model = std::make_shared<Net>();
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   ft::FaultTolerantDdp<Net> trainer(model, sgd, elastic);
//   while (trainer.step() < steps) {
//     trainer.train_step([&](DistributedDataParallel<Net>& ddp, int rank, int size) {
//       // this rank's share of global batch trainer.step(), cut over `size` ranks
//       torch::mse_loss(ddp.forward(x), y).backward();
//     });
//   }
//   trainer.finish();
//
// For the trajectory not to depend on who is alive, define each global batch by the step
// alone and cut it over the ranks of the moment; gradients are averaged by samples
// (DdpOptions::average_by_samples is always on), so a step over 2 ranks equals the step over
// 3 within float round-off. The optimizer must be one train/optimizer_state.h supports
// (SGD, Adam, AdamW) and hold the module's parameters.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/error.h"
#include "datapar/ft/elastic_group.h"

namespace datapar::ft {
namespace detail {

// The state a joining member takes: the module's parameters and buffers, the optimizer's
// state (train/optimizer_state.h) and the committed step, as the bytes of a torch.save file.
std::string save_training_state(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                                int64_t step);
// Loads what save_training_state wrote into `module` and `optimizer`; returns the step.
int64_t load_training_state(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const std::string& bytes);

// Whether an exception from a step is a failure of the membership (a member died, hung or
// left: train the step again) rather than an error of the program: datapar's CommError and
// TimeoutError, or anything once the epoch's group was aborted.
bool is_membership_failure(std::exception_ptr error, const ElasticGroup& elastic);

}  // namespace detail

template <typename ModuleImpl>
class FaultTolerantDdp {
 public:
  using Ddp = DistributedDataParallel<ModuleImpl>;
  // Step 0 by default; a job resumed from a checkpoint passes the checkpoint's step.
  FaultTolerantDdp(std::shared_ptr<ModuleImpl> module, torch::optim::Optimizer& optimizer, ElasticGroup& elastic,
                   DdpOptions options = {}, int64_t step = 0)
      : module_(std::move(module)), optimizer_(optimizer), elastic_(elastic), options_(options), step_(step) {
    options_.average_by_samples = true;
  }

  // The steps committed so far: the step train_step() trains next.
  int64_t step() const { return step_; }
  // Membership epochs joined so far (1 in a run without failures or newcomers).
  int64_t epochs_joined() const { return epochs_joined_; }
  ElasticGroup& elastic() { return elastic_; }

  // Trains step step(): joins a new epoch first when needed (taking the state of a member at
  // the newest step if this one is behind), zeroes the gradients, calls train(ddp, rank,
  // size) to run forward and backward on this rank's share of the step's global batch (in
  // it, step() is the step it trains: a member that joined has taken it from the others), and
  // votes; applies the optimizer's update only when every member may commit. Returns whether
  // the step was committed; if not, call again: the step is trained anew over the new
  // membership. Throws MembershipError when the job cannot go on (below the minimum, the
  // store gone), and whatever `train` throws that is not a failure of a member.
  bool train_step(const std::function<void(Ddp&, int rank, int size)>& train) {
    try {
      if (!ddp_) reconfigure();
      optimizer_.zero_grad();
      train(*ddp_, elastic_.rank(), elastic_.size());
      const Vote vote = elastic_.vote(step_);
      if (vote.commit) {
        optimizer_.step();
        ++step_;
      }
      if (vote.reconfigure) ddp_.reset();
      return vote.commit;
    } catch (...) {
      if (!detail::is_membership_failure(std::current_exception(), elastic_)) throw;
      elastic_.abort();  // first: DDP's destructor waits for its collectives in flight
      ddp_.reset();
      return false;
    }
  }

  // At the end of training, after the last train_step(): waits until every member is done
  // (ElasticGroup::leave), so that no member is still in the last vote when others exit.
  void finish() { elastic_.leave(); }

 private:
  void reconfigure() {
    ddp_.reset();
    elastic_.join(step_);
    ++epochs_joined_;
    elastic_.heal([&] { return detail::save_training_state(*module_, optimizer_, step_); },
                  [&](const std::string& bytes) { step_ = detail::load_training_state(*module_, optimizer_, bytes); });
    ddp_.emplace(module_, elastic_.group(), options_);
  }

  std::shared_ptr<ModuleImpl> module_;
  torch::optim::Optimizer& optimizer_;
  ElasticGroup& elastic_;
  DdpOptions options_;
  int64_t step_;
  int64_t epochs_joined_ = 0;
  std::optional<Ddp> ddp_;
};

}  // namespace datapar::ft
