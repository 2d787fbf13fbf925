// What the phases of `datapar bench ddp` share (bench_ddp.cc, bench_slow_link.h): the
// synthetic batches, the model and optimizer every phase starts from, a timed training step,
// and the timing of a phase (the slowest rank's).
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "bench_ddp.h"
#include "bench_format.h"  // median
#include "bench_line.h"
#include "datapar/process_group/metadata.h"
#include "datapar/process_group/process_group.h"
#include "datapar/trace.h"

namespace datapar::tools {

using Clock = std::chrono::steady_clock;

struct Batch {
  at::Tensor x, y;
};

// Where the steps of one phase spent their time, per step: the slowest rank's values.
struct PhaseTimes {
  double step = 0;                              // wall time
  double forward = 0, backward = 0, optimizer = 0;  // medians; backward includes DDP's synchronisation
  double cpu_main = 0, cpu_other = 0;           // CPU time: this thread, the process's other threads
};

// Per-step durations of a training step's parts, filled in by the step.
struct StepParts {
  std::vector<double> forward, backward, optimizer;
};

inline double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Waits for the work queued on the group's device: on a GPU, kernels and collectives run
// after the host has moved on, so a host clock read is only a time once they are done.
// (Copying one value to the host waits for the current stream, which DDP's collectives
// join through Work::wait.) On a GPU the step parts (forward, backward, optimizer) time
// what the host queued, not what the device ran; the step times are exact.
inline void synchronize(const ProcessGroup& group) {
  if (!group.device().is_cpu()) (void)host_doubles(metadata_zeros(group, 1, at::kDouble));
}

inline double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Runs `step` `steps` times after `warmup`; every value is the slowest rank's. `line` shows
// the phase `phase` at a terminal.
template <typename Step>
PhaseTimes time_steps(BenchLine& line, const char* phase, ProcessGroup& group, int warmup, int steps, Step&& step,
                      StepParts* parts = nullptr) {
  line.phase(phase, warmup + steps);
  for (int i = 0; i < warmup; ++i) {
    step(i);
    line.step(i + 1);
  }
  if (parts) *parts = StepParts{};
  group.barrier()->wait();
  synchronize(group);
  const double thread_start = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  const double process_start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    step(i);
    line.step(warmup + i + 1);
  }
  synchronize(group);
  const double elapsed = seconds_since(start);
  const double thread_cpu = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread_start;
  const double process_cpu = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process_start;
  at::Tensor t = metadata_tensor(group, std::vector<double>{elapsed / steps, parts ? median(parts->forward) : 0.0,
                                                            parts ? median(parts->backward) : 0.0,
                                                            parts ? median(parts->optimizer) : 0.0, thread_cpu / steps,
                                                            (process_cpu - thread_cpu) / steps});
  group.all_reduce(t, ReduceOp::kMax)->synchronize();
  const std::vector<double> v = host_doubles(t);
  return {v[0], v[1], v[2], v[3], v[4], v[5]};
}

// What every phase of one model's benchmark shares: its batches, how to make the model and
// its optimizer, and the training step.
template <typename Module>
struct ModelBench {
  ModelBench(const BenchDdpOptions& options, int batch, int steps, ProcessGroup& group, std::function<Module()> make)
      : o(options), batch(batch), steps(steps), group(group), make(std::move(make)) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + group.rank());
    for (int i = 0; i < 4; ++i) {
      batches.push_back({at::randn({batch, 1, 28, 28}, gen, at::kFloat).to(group.device()),
                         at::randint(10, {batch}, gen, at::kLong).to(group.device())});
    }
  }

  // The model every phase starts from: the same seed, on the group's device (nccl: cuda:LOCAL_RANK).
  Module fresh_model() const {
    torch::manual_seed(0);
    Module model = make();
    model->to(group.device());
    return model;
  }

  // The optimizer of every phase: SGD (lr 0.01) or Adam (lr 1e-3).
  std::unique_ptr<torch::optim::Optimizer> optimizer(std::vector<at::Tensor> params) const {
    if (o.optimizer == "adam") return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(1e-3));
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.01));
  }

  // Step i: forward, cross-entropy, backward, optimizer step (`optimizer`: a
  // torch::optim::Optimizer or a ZeroRedundancyOptimizer), each part timed into `parts`.
  template <typename Forward, typename Optimizer>
  void train_step(Forward& forward, Optimizer& optimizer, StepParts& parts, int i) const {
    const Batch& b = batches[i % batches.size()];
    trace::set_step(i);
    optimizer.zero_grad();
    auto start = Clock::now();
    at::Tensor out;
    {
      const trace::Span span("forward", "step");
      out = forward(b.x);
    }
    parts.forward.push_back(seconds_since(start));
    start = Clock::now();
    {
      const trace::Span span("backward", "step");
      at::cross_entropy_loss(out, b.y).backward();
    }
    parts.backward.push_back(seconds_since(start));
    start = Clock::now();
    {
      const trace::Span span("optimizer step", "step");
      optimizer.step();
    }
    parts.optimizer.push_back(seconds_since(start));
  }

  const BenchDdpOptions& o;
  const int batch, steps;
  ProcessGroup& group;
  const std::function<Module()> make;
  std::vector<Batch> batches;
  mutable BenchLine line{group};  // the live line at a terminal
};

}  // namespace datapar::tools
