// train::CudaGraphStep where no GPU runs it: what it refuses before anything is captured.
// The captured steps themselves are GPU tests (tests/gpu/gpu_test.cc, Gpu.CudaGraph*).
#include "datapar/train/cuda_graph_step.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <vector>

#include "datapar/config.h"
#include "datapar/error.h"
#include "testing/expect_throw.h"

namespace datapar::train {
namespace {

TEST(CudaGraphStep, RefusesWhatAGraphCannotHold) {
  torch::nn::Linear net(4, 2);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  const auto nothing = [](const std::vector<at::Tensor>&) { return std::vector<at::Tensor>{}; };
#if !DATAPAR_HAVE_CUDA
  EXPECT_THROW_MSG(CudaGraphStep(sgd, nothing), InvalidArgumentError, "built against a libtorch without CUDA");
#else
  torch::optim::Adam adam(net->parameters());
  EXPECT_THROW_MSG(CudaGraphStep(adam, nothing), InvalidArgumentError,
                   "Adam and AdamW count their steps on the host");
  CudaGraphStepOptions none;
  none.warmup_steps = 0;
  EXPECT_THROW_MSG(CudaGraphStep(sgd, nothing, none), InvalidArgumentError, "warmup_steps is 0");
  CudaGraphStep step(sgd, nothing);
  EXPECT_THROW_MSG(step({at::zeros({2, 4})}), InvalidArgumentError, "a CUDA graph runs on a GPU");
  EXPECT_FALSE(step.captured());
#endif
}

}  // namespace
}  // namespace datapar::train
