// --sync-every H: local SGD or DiLoCo (datapar/diloco/diloco.h) over a mode's replicas. Under
// --mode ddp each rank is a replica: it trains its own copy of the model with its own optimizer;
// under --mode hsdp each shard group is one (FSDP within it, its shards averaged with the
// other groups' matching ranks). Every H steps (and at each epoch's end, so that evaluation
// and checkpoints see one model) the replicas average what they train and take the outer
// step. Each rank keeps its own optimizer state and DiLoCo's state beside every checkpoint
// (diloco-epoch-E-rank-R.pt), which --resume reads back.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <utility>
#include <vector>

#include "datapar/diloco/diloco.h"
#include "datapar/distributed.h"
#include "fsdp.h"
#include "single_device.h"

namespace datapar::tools {

// --sync-every and --outer-*'s DiLoCo options.
DiLoCoOptions diloco_options(const TrainOptions& o);

// Each rank's own state beside the checkpoint of `epoch` epochs: `diloco`'s and `optimizer`'s
// (SGD's momentum, Adam's moments and step; in --checkpoint-dir, written whole or not at
// all); and back, saying so when there is none (DiLoCo's outer momentum and this rank's
// inner state then start afresh). Throws InvalidArgumentError for a file that is not such a
// state, or one of another optimizer.
void save_diloco_state(const TrainPlan& plan, const DiLoCo& diloco, const torch::optim::Optimizer& optimizer,
                       const std::vector<at::Tensor>& params, int64_t epoch);
std::unique_ptr<DiLoCo> load_diloco_state(const TrainPlan& plan, std::unique_ptr<DiLoCo> diloco,
                                          torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params,
                                          const std::shared_ptr<ProcessGroup>& across, int64_t epoch);

// Inner: a strategy with trained_parameters() and inner_optimizer() (SingleDevice, FsdpMode),
// made from `args`; `across`: the group of the replicas' matching ranks.
template <typename Inner>
class DiLoCoMode : public Inner {
 public:
  template <typename... Args>
  explicit DiLoCoMode(std::shared_ptr<ProcessGroup> across, Args&&... args)
      : Inner(std::forward<Args>(args)...),
        across_(std::move(across)),
        diloco_(std::make_unique<DiLoCo>(this->trained_parameters(), across_, diloco_options(this->plan_.options))) {}

  void step() override {
    Inner::step();
    diloco_->step();
  }
  void end_of_epoch() override {
    Inner::end_of_epoch();
    if (diloco_->steps_since_sync() > 0) diloco_->sync();
  }
  void save_checkpoint(int64_t epoch) override {
    Inner::save_checkpoint(epoch);  // rank 0's: every replica is the same now
    save_diloco_state(this->plan_, *diloco_, this->inner_optimizer(), this->trained_parameters(), epoch);
  }
  void resumed(int64_t epoch) override {
    Inner::resumed(epoch);
    diloco_ = load_diloco_state(this->plan_, std::move(diloco_), this->inner_optimizer(), this->trained_parameters(),
                                across_, epoch);
  }

 private:
  std::shared_ptr<ProcessGroup> across_;
  std::unique_ptr<DiLoCo> diloco_;
};

}  // namespace datapar::tools
