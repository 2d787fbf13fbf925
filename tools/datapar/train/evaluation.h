// Exact numbers over the ranks: sums (or maxima) of a rank's values over the job, and test
// accuracy with every test sample counted once however many ranks read the test set (the
// sampler's evaluation mode; its padding rows are skipped).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "../train.h"
#include "data.h"
#include "datapar/distributed.h"
#include "datapar/process_group/metadata.h"

namespace datapar::tools {

using Forward = std::function<at::Tensor(const at::Tensor&)>;

// Sums (or maxima) of `values` over the job, through the group's device (nccl: the GPU);
// the values themselves outside a job.
template <typename T>
std::vector<T> reduce(const std::vector<T>& values, ReduceOp op, ProcessGroup* over = nullptr) {
  if (over == nullptr && !is_initialized()) return values;
  ProcessGroup& group = over != nullptr ? *over : *default_group();
  at::Tensor t = metadata_tensor(group, values);
  group.all_reduce(t, op)->synchronize();
  if constexpr (std::is_same_v<T, int64_t>) {
    return host_int64s(t);
  } else {
    return host_doubles(t);
  }
}

// Which part of the test set a rank evaluates: part `rank` of `size`, the parts summed over
// `group` (nullptr: the job's default group; unused when size is 1).
struct EvalPart {
  int rank = 0;
  int size = 1;
  ProcessGroup* group = nullptr;
};

// Test accuracy, exact over all ranks: {correct, samples} summed over the parts (by default
// one per rank of the job). `model` is put in eval mode; `forward` is the mode's.
std::pair<int64_t, int64_t> evaluate(const TrainPlan& plan, const Data& data, torch::nn::Module& model,
                                     const Forward& forward, const c10::Device& device,
                                     std::optional<EvalPart> part = std::nullopt);

}  // namespace datapar::tools
