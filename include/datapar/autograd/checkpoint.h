// Activation checkpointing: a segment of the forward whose activations are not kept for
// backward but recomputed there, trading compute for memory (PyTorch's
// torch.utils.checkpoint, which libtorch lacks: pytorch#52744).
//
//   auto block = [&](const at::Tensor& x) { return layer2->forward(torch::relu(layer1->forward(x))); };
//   at::Tensor y = datapar::checkpoint(block, x);  // layer1's and relu's outputs are not kept
//
// Forward runs the segment without recording a graph; backward runs it again, with the RNG
// states of the forward (dropout draws the same masks), and backpropagates through the
// recomputation: the segment's parameters get their gradients as without checkpointing,
// whether or not its inputs require grad (PyTorch's reentrant checkpoint gives them none
// then). It works under DistributedDataParallel: DDP's end of backward waits for the outer
// backward, not the recomputation's (Note [Backward inside backward] in checkpoint.cc).
//
// The segment must compute the same thing both times: the same number of outputs, shapes
// and dtypes (checked: InvalidArgumentError), from inputs not changed in place in between
// (checked). Not supported: double backward through a checkpoint, and modules whose forward
// changes their state (BatchNorm's running statistics are updated twice).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace datapar {

struct CheckpointOptions {
  // Recompute with the RNG states the forward started with (the CPU's and those of the
  // inputs' CUDA devices), leaving the program's RNG streams where they were.
  bool preserve_rng_state = true;
};

// The segment maps inputs to outputs; tensors only (capture anything else in the lambda).
using Segment = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// segment(inputs), recomputed in backward. Outside grad mode, just segment(inputs).
std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});

// The same for a segment of one tensor.
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& segment, const at::Tensor& input,
                      const CheckpointOptions& options = {});

}  // namespace datapar
