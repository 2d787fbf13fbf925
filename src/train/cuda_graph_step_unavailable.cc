// See datapar/train/cuda_graph_step.h: a build without CUDA (a CPU libtorch) has no graphs.
#include "datapar/train/cuda_graph_step.h"

#include "datapar/error.h"

namespace datapar::train {

struct CudaGraphStep::Impl {};

CudaGraphStep::CudaGraphStep(torch::optim::Optimizer&, Step, CudaGraphStepOptions) {
  throw InvalidArgumentError(
      "CudaGraphStep: this datapar was built against a libtorch without CUDA, which has no CUDA graphs.\n---> HINT: "
      "build it against a CUDA libtorch (pip's torch, or pytorch.org's CUDA zip) to train with CUDA graphs.");
}

CudaGraphStep::~CudaGraphStep() = default;

bool CudaGraphStep::fits(const std::vector<at::Tensor>&) const { return true; }

bool CudaGraphStep::captured() const { return false; }

int64_t CudaGraphStep::replays() const { return 0; }

std::vector<at::Tensor> CudaGraphStep::operator()(const std::vector<at::Tensor>&) { return {}; }

}  // namespace datapar::train
