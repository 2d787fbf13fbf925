// --mode ddp --sync-every H: local SGD or DiLoCo (datapar/diloco/diloco.h). Each rank trains
// its own copy of the model with its own SGD, and every H steps (and at each epoch's end, so
// that evaluation and checkpoints see one model) the ranks average their parameters and take
// the outer step. Each rank keeps its own SGD momentum and DiLoCo's state beside every
// checkpoint (diloco-epoch-E-rank-R.pt), which --resume reads back.
#pragma once

#include <torch/optim/sgd.h>

#include <memory>

#include "datapar/diloco/diloco.h"
#include "datapar/distributed.h"
#include "single_device.h"

namespace datapar::tools {

// --sync-every and --outer-*'s DiLoCo options.
DiLoCoOptions diloco_options(const TrainOptions& o);

// Each rank's own state beside the checkpoint of `epoch` epochs: `diloco`'s and `sgd`'s
// momentum buffers (in --checkpoint-dir, written whole or not at all); and back, saying
// so when there is none (DiLoCo's outer momentum and this rank's inner momentum then start
// afresh). Throws InvalidArgumentError for a file that is not such a state.
void save_diloco_state(const TrainPlan& plan, const DiLoCo& diloco, const torch::optim::SGD& sgd,
                       const std::vector<at::Tensor>& params, int64_t epoch);
std::unique_ptr<DiLoCo> load_diloco_state(const TrainPlan& plan, std::unique_ptr<DiLoCo> diloco,
                                          torch::optim::SGD& sgd, const std::vector<at::Tensor>& params,
                                          int64_t epoch);

template <typename Impl>
class DiLoCoMode : public SingleDevice<Impl> {
 public:
  DiLoCoMode(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::SGD& sgd)
      : SingleDevice<Impl>(plan, model, sgd),
        diloco_(std::make_unique<DiLoCo>(model->parameters(), default_group(), diloco_options(plan.options))) {}

  void step() override {
    this->sgd_.step();
    diloco_->step();
  }
  void end_of_epoch() override {
    if (diloco_->steps_since_sync() > 0) diloco_->sync();
  }
  void save_checkpoint(int64_t epoch) override {
    SingleDevice<Impl>::save_checkpoint(epoch);  // rank 0's: every rank's model is the same now
    save_diloco_state(this->plan_, *diloco_, this->sgd_, this->model_->parameters(), epoch);
  }
  void resumed(int64_t epoch) override {
    diloco_ = load_diloco_state(this->plan_, std::move(diloco_), this->sgd_, this->model_->parameters(), epoch);
  }

 private:
  std::unique_ptr<DiLoCo> diloco_;
};

}  // namespace datapar::tools
