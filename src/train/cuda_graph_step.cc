// See datapar/train/cuda_graph_step.h. Compiled only where Torch has CUDA.
#include "datapar/train/cuda_graph_step.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <deque>
#include <optional>
#include <sstream>
#include <thread>

#include "datapar/error.h"

namespace datapar::train {
namespace {

using detail::str_cat;

std::string describe(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << ' ' << t.scalar_type() << " on " << t.device();
  return out.str();
}

bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

}  // namespace

struct CudaGraphStep::Impl {
  torch::optim::Optimizer& optimizer;
  Step fn;
  CudaGraphStepOptions options;
  int calls = 0;
  c10::DeviceIndex device = -1;
  std::optional<c10::cuda::CUDAStream> side;  // warm-up and capture run here, off the caller's stream
  std::vector<at::Tensor> inputs;             // the graph's static inputs
  std::vector<at::Tensor> outputs;            // fn's; the graph's static outputs once captured
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::deque<at::cuda::CUDAEvent> in_flight;  // each replay's end, oldest first
  int64_t replays = 0;

  Impl(torch::optim::Optimizer& o, Step f, CudaGraphStepOptions opts)
      : optimizer(o), fn(std::move(f)), options(std::move(opts)) {}

  // The side stream waits for what the caller queued so far; the inputs are copied there.
  void enter_side(const std::vector<at::Tensor>& given) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(*side);
    const c10::cuda::CUDAStreamGuard on_side(*side);
    for (size_t i = 0; i < inputs.size(); ++i) inputs[i].copy_(given[i], /*non_blocking=*/true);
  }
  // The caller's stream waits for the side stream's work.
  void leave_side() {
    at::cuda::CUDAEvent done;
    done.record(*side);
    done.block(c10::cuda::getCurrentCUDAStream(device));
  }

  void warm_up(const std::vector<at::Tensor>& given) {
    enter_side(given);
    {
      const c10::cuda::CUDAStreamGuard on_side(*side);
      optimizer.zero_grad(/*set_to_none=*/true);
      outputs = fn(inputs);
    }
    leave_side();
  }

  // Note [Gradients set to none before the capture]: backward then allocates each gradient
  // from the graph's pool and writes it, so every replay writes it afresh; a gradient that
  // existed at the capture would be accumulated into by every replay.
  void capture(const std::vector<at::Tensor>& given) {
    enter_side(given);
    optimizer.zero_grad(/*set_to_none=*/true);
    graph = std::make_unique<at::cuda::CUDAGraph>();
    const c10::cuda::CUDAStreamGuard on_side(*side);
    // Thread-local: the NCCL watchdog's and the loader's threads go on with their own CUDA
    // calls meanwhile, which a global capture would refuse.
    graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      outputs = fn(inputs);
    } catch (...) {
      try {
        graph->capture_end();  // ends the stream's capture, whatever it holds
      } catch (...) {
      }
      graph.reset();
      throw;
    }
    graph->capture_end();
  }

  // Bounded: a replay's collectives are not watched (the header says why).
  void wait_for_replays(size_t keep) {
    while (in_flight.size() > keep) {
      const auto deadline = std::chrono::steady_clock::now() + options.timeout;
      auto pause = std::chrono::microseconds(50);
      while (!in_flight.front().query()) {
        if (std::chrono::steady_clock::now() > deadline) {
          if (options.on_timeout) options.on_timeout();
          throw TimeoutError(str_cat(
              "CudaGraphStep: replay ", replays - static_cast<int64_t>(in_flight.size()), " did not finish within ",
              std::chrono::duration<double>(options.timeout).count(),
              " s. A collective captured in the step waits for a peer that died or hangs (the graph's collectives "
              "are not watched by the group's watchdog).\n---> HINT: see the other ranks' logs; raise "
              "CudaGraphStepOptions::timeout for steps that take longer."));
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(2000));
      }
      in_flight.pop_front();
    }
  }

  void replay(const std::vector<at::Tensor>& given) {
    wait_for_replays(1);  // at most two replays queued: the host stays a step ahead, no more
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
    for (size_t i = 0; i < inputs.size(); ++i) inputs[i].copy_(given[i], /*non_blocking=*/true);
    graph->replay();
    in_flight.emplace_back();
    in_flight.back().record(current);
    ++replays;
  }
};

CudaGraphStep::CudaGraphStep(torch::optim::Optimizer& optimizer, Step fn, CudaGraphStepOptions options)
    : impl_(std::make_unique<Impl>(optimizer, std::move(fn), std::move(options))) {
  DATAPAR_CHECK(dynamic_cast<torch::optim::Adam*>(&optimizer) == nullptr &&
                    dynamic_cast<torch::optim::AdamW*>(&optimizer) == nullptr,
                "CudaGraphStep: torch::optim::Adam and AdamW count their steps on the host and compute the bias "
                "correction from that count; a replayed step would repeat the captured step's.\n---> HINT: use SGD "
                "under a CUDA graph (datapar train --optimizer sgd), or train without one.");
  DATAPAR_CHECK(impl_->options.warmup_steps >= 1, "CudaGraphStep: warmup_steps is ", impl_->options.warmup_steps,
                "; at least 1 eager step must run before the capture (the optimizer's state and cuBLAS's workspaces "
                "are made there).");
  DATAPAR_CHECK(impl_->options.timeout.count() > 0, "CudaGraphStep: the timeout must be positive.");
}

CudaGraphStep::~CudaGraphStep() {
  try {
    if (impl_->graph) impl_->wait_for_replays(0);  // the static tensors outlive what reads them
  } catch (...) {
  }
}

bool CudaGraphStep::fits(const std::vector<at::Tensor>& inputs) const {
  const Impl& m = *impl_;
  if (m.inputs.empty()) return true;
  if (inputs.size() != m.inputs.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!same_layout(inputs[i], m.inputs[i])) return false;
  }
  return true;
}

bool CudaGraphStep::captured() const { return impl_->graph != nullptr; }

int64_t CudaGraphStep::replays() const { return impl_->replays; }

std::vector<at::Tensor> CudaGraphStep::operator()(const std::vector<at::Tensor>& inputs) {
  Impl& m = *impl_;
  DATAPAR_CHECK(!inputs.empty(), "CudaGraphStep: a step takes at least one input tensor.");
  for (size_t i = 0; i < inputs.size(); ++i) {
    DATAPAR_CHECK(inputs[i].defined() && inputs[i].is_cuda(), "CudaGraphStep: input ", i, " is ",
                  inputs[i].defined() ? describe(inputs[i]) : std::string("undefined"),
                  "; a CUDA graph runs on a GPU: move the batch there first.");
  }
  if (m.inputs.empty()) {
    m.device = inputs.front().device().index();
    for (const at::Tensor& t : inputs) {
      DATAPAR_CHECK(t.device() == inputs.front().device(), "CudaGraphStep: the inputs are on ",
                    inputs.front().device(), " and ", t.device(), "; a step's graph runs on one GPU.");
      m.inputs.push_back(at::empty_like(t, at::MemoryFormat::Contiguous));
    }
    m.side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, m.device);
  } else {
    DATAPAR_CHECK(inputs.size() == m.inputs.size(), "CudaGraphStep: ", inputs.size(), " inputs; the first step had ",
                  m.inputs.size(), ".");
    for (size_t i = 0; i < inputs.size(); ++i) {
      DATAPAR_CHECK(same_layout(inputs[i], m.inputs[i]), "CudaGraphStep: a CUDA graph replays the shapes it ",
                    "captured: input ", i, " is ", describe(inputs[i]), ", the graph's ", describe(m.inputs[i]),
                    ".\n---> HINT: give every step the same batch (drop the epoch's last partial batch), or run it "
                    "without the graph.");
    }
  }
  const c10::cuda::CUDAGuard guard(m.device);
  if (!m.graph && m.calls < m.options.warmup_steps) {
    m.warm_up(inputs);
  } else {
    if (!m.graph) {
      m.capture(inputs);
      m.leave_side();  // the capture ran nothing; its first replay is this step
    }
    m.replay(inputs);
  }
  ++m.calls;
  return m.outputs;
}

}  // namespace datapar::train
