// CudaGraphStep: a whole training step on a GPU (forward, loss, backward with DDP's bucket
// all-reduces on NCCL, the optimizer's update) captured once into a CUDA graph and replayed,
// as PyTorch's whole-network capture (torch.cuda.graph, torchtitan's and the Rust rival's):
// one launch per step instead of one per kernel, for models small enough that the host's
// launches, not the GPU, set the pace.
//
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   datapar::train::CudaGraphStep step(sgd, [&](const std::vector<at::Tensor>& in) {
//     at::Tensor loss = at::cross_entropy_loss(ddp.forward(in[0]), in[1]);
//     loss.backward();
//     sgd.step();
//     return std::vector<at::Tensor>{loss.detach()};
//   });
//   for (auto& [x, y] : batches) {
//     const at::Tensor loss = step({x, y}).at(0);  // x, y on the GPU, the same shapes every step
//   }
//
// The first `warmup_steps` calls run `fn` eagerly on a side stream (cuBLAS's workspaces, the
// optimizer's state, DDP's rebuilt buckets come into being there); the next captures it, and
// every later call copies its inputs into the graph's static inputs and replays it. `fn`
// must not zero the gradients: the step sets them to none before each warm-up step and the
// capture, so that backward writes them afresh on every replay. The outputs fn returns are
// the graph's: each replay overwrites them (clone one to keep it).
//
// What a graph cannot hold is refused with a message when it is met: inputs of another
// shape, dtype or device than the first call's (drop the epoch's last partial batch); an
// optimizer that keeps its step count on the host (torch::optim::Adam and AdamW compute
// their bias corrections from it: a replay would repeat the captured step's); and, inside,
// DDP's find_unused_parameters and average_by_samples (host reads each step), a blocking
// NCCL wait (NcclOptions::blocking_wait), a host read (.item()). The learning rate is the
// one at the capture: a schedule needs a new CudaGraphStep.
//
// A replay's collectives are not watched by the group's watchdog (the host does not see
// them): a call first waits for the replay two steps back, at most `timeout`, and on
// running past it calls `on_timeout` (e.g. the group's abort()) and throws TimeoutError, so
// a dead peer ends the job instead of hanging it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace datapar::train {

struct CudaGraphStepOptions {
  int warmup_steps = 3;  // eager steps before the capture (DDP rebuilds its buckets after its first)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // a replay's limit (see above)
  std::function<void()> on_timeout;  // before the TimeoutError, e.g. [&] { group->abort(); }
};

class CudaGraphStep {
 public:
  using Step = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

  // `optimizer`: the one `fn` steps (SGD; its gradients are set to none before warm-up steps
  // and the capture). Throws InvalidArgumentError in a build without CUDA and for an
  // optimizer whose step cannot be replayed.
  CudaGraphStep(torch::optim::Optimizer& optimizer, Step fn, CudaGraphStepOptions options = {});
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  // One step on `inputs` (CUDA tensors on one device): eager, captured or replayed. Returns
  // fn's outputs (the graph's static ones once captured).
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs);

  // Whether `inputs` have the shapes, dtypes and devices of the first call's (a replay's
  // condition); always true before the first call.
  bool fits(const std::vector<at::Tensor>& inputs) const;
  bool captured() const;
  int64_t replays() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace datapar::train
