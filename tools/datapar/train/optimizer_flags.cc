// See optimizer_flags.h.
#include "optimizer_flags.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <string>

#include "../train.h"
#include "datapar/error.h"

namespace datapar::tools {

void check_optimizer_flags(const TrainOptions& o) {
  DATAPAR_CHECK(one_of(o.optimizer, {"sgd", "adam", "adamw"}), "--optimizer: \"", o.optimizer,
                "\" is not an optimizer datapar train knows.\n---> HINT: use sgd (the default), adam or adamw.");
  DATAPAR_CHECK(!o.lr || (*o.lr > 0 && std::isfinite(*o.lr)), "--lr ", o.lr.value_or(0),
                ": the learning rate must be positive and finite (d2l's SGD uses 0.1, torch.optim's Adam 1e-3).");
  DATAPAR_CHECK(one_of(o.amp, {"none", "bf16", "fp16"}), "--amp: \"", o.amp, "\" is not a precision datapar train ",
                "autocasts to.\n---> HINT: use bf16, fp16 (with a gradient scaler) or none.");
  DATAPAR_CHECK(o.amp != "fp16" || !o.fault_tolerant || o.sync_every == 0, "--amp fp16 --fault-tolerant --sync-every ",
                o.sync_every, ": each replica's gradient scaler skips its own inner steps, which a round trained again ",
                "after a failure would have to undo; not supported yet.\n---> HINT: use --amp bf16 (it needs no scaler), ",
                "or fp16 without --sync-every.");
  DATAPAR_CHECK(o.momentum >= 0 && o.momentum < 1, "--momentum ", o.momentum, ": use a value in [0, 1).");
  DATAPAR_CHECK(o.momentum == 0 || o.optimizer == "sgd", "--momentum ", o.momentum, " is SGD's; --optimizer ",
                o.optimizer, " keeps moments of its own (betas 0.9 and 0.999).\n---> HINT: leave out --momentum, ",
                "or use --optimizer sgd.");
  DATAPAR_CHECK(!o.weight_decay || (*o.weight_decay >= 0 && std::isfinite(*o.weight_decay)), "--weight-decay ",
                o.weight_decay.value_or(0), ": use a finite value >= 0 (0: none; 5e-4 is common for ResNets).");
}

double learning_rate(const TrainOptions& o) { return o.lr.value_or(o.optimizer == "sgd" ? 0.1 : 1e-3); }

double weight_decay(const TrainOptions& o) { return o.weight_decay.value_or(o.optimizer == "adamw" ? 0.01 : 0); }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainPlan& plan, std::vector<at::Tensor> params) {
  const TrainOptions& o = plan.options;
  if (o.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(std::move(params),
                                                torch::optim::AdamOptions(plan.lr).weight_decay(plan.weight_decay));
  }
  if (o.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(std::move(params),
                                                 torch::optim::AdamWOptions(plan.lr).weight_decay(plan.weight_decay));
  }
  return std::make_unique<torch::optim::SGD>(
      std::move(params), torch::optim::SGDOptions(plan.lr).momentum(o.momentum).weight_decay(plan.weight_decay));
}

}  // namespace datapar::tools
