// Exact evaluation. See evaluation.h.
#include "evaluation.h"

#include <torch/utils.h>

#include "datapar/data/distributed_sampler.h"
#include "datapar/data/loader.h"

namespace datapar::tools {

std::pair<int64_t, int64_t> evaluate(const TrainPlan& plan, const Data& data, torch::nn::Module& model,
                                     const Forward& forward, const c10::Device& device, std::optional<EvalPart> part) {
  const EvalPart p = part.value_or(EvalPart{plan.rank, plan.world_size, nullptr});
  torch::NoGradGuard no_grad;
  model.eval();
  DistributedSampler sampler(DistributedSamplerOptions::evaluation(data.test->size(), p.size, p.rank));
  DataLoader loader(data.test, {plan.rank_batch, plan.options.workers});
  loader.start_epoch(sampler);
  int64_t correct = 0, samples = 0;  // padding rows skipped
  while (auto batch = loader.next()) {
    const at::Tensor predicted = forward(batch->data.to(device)).argmax(1).cpu();
    const at::Tensor real = batch->is_padding.logical_not();
    correct += predicted.eq(batch->target).logical_and(real).sum().item<int64_t>();
    samples += real.sum().item<int64_t>();
  }
  if (p.size == 1) return {correct, samples};
  const std::vector<int64_t> counts = reduce(std::vector<int64_t>{correct, samples}, ReduceOp::kSum, p.group);
  return {counts[0], counts[1]};
}

}  // namespace datapar::tools
