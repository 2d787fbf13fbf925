// datapar bench ddp. See bench_ddp.h.
//
// Data are Fashion-MNIST shaped (1x28x28, 10 classes) synthetic batches made up front, so
// the numbers are about training and synchronisation, not loading. A step is forward,
// cross-entropy, backward, SGD step. Every phase starts at a barrier and its time is the
// slowest rank's. Hidden share: 1 - (DDP step - local step) / all-reduce time alone.
#include "bench_ddp.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>

#include "datapar/cpu_allocator.h"
#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "local_job.h"

namespace datapar::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Batch {
  at::Tensor x, y;
};

// Seconds per step of `step` run `steps` times after `warmup`, the slowest rank's.
template <typename Step>
double time_steps(ProcessGroup& group, int warmup, int steps, Step&& step) {
  for (int i = 0; i < warmup; ++i) step(i);
  group.barrier()->wait();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step(i);
  at::Tensor elapsed = at::full({1}, std::chrono::duration<double>(Clock::now() - start).count(), at::kDouble);
  group.all_reduce(elapsed, ReduceOp::kMax)->wait();
  return elapsed.item<double>() / steps;
}

template <typename Module>
int run_model(const BenchDdpOptions& o, int batch, int steps, ProcessGroup& group,
              const std::function<Module()>& make) {
  const int rank = group.rank(), world = group.size();
  std::vector<Batch> batches;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
  for (int i = 0; i < 4; ++i) {
    batches.push_back({at::randn({batch, 1, 28, 28}, gen, at::kFloat), at::randint(10, {batch}, gen, at::kLong)});
  }
  auto train_step = [&](auto& forward, torch::optim::SGD& sgd, int i) {
    const Batch& b = batches[i % batches.size()];
    sgd.zero_grad();
    at::cross_entropy_loss(forward(b.x), b.y).backward();
    sgd.step();
  };

  torch::manual_seed(0);
  Module local = make();
  torch::optim::SGD local_sgd(local->parameters(), 0.01);
  auto local_forward = [&](const at::Tensor& x) { return local->forward(x); };
  const double t_local = time_steps(group, o.warmup, steps, [&](int i) { train_step(local_forward, local_sgd, i); });

  torch::manual_seed(0);
  Module model = make();
  DistributedDataParallel ddp(model.ptr());
  torch::optim::SGD sgd(ddp.parameters(), 0.01);
  auto ddp_forward = [&](const at::Tensor& x) { return ddp.forward(x); };
  // Per step, how long backward waited for its buckets after its last gradient. The rank
  // that finished backward first also waits for the other ranks to catch up; the one that
  // finished last waits for communication only: the step's minimum over ranks is the
  // communication backward did not hide.
  at::Tensor waits = at::zeros({o.warmup + steps}, at::kDouble);
  int64_t taken = 0;  // warmup steps first, then the timed ones
  const double t_ddp = time_steps(group, o.warmup, steps, [&](int i) {
    const auto before = ddp.communication_stats().exposed_wait;
    train_step(ddp_forward, sgd, i);
    waits[taken++] = std::chrono::duration<double>(ddp.communication_stats().exposed_wait - before).count();
  });
  group.all_reduce(waits, ReduceOp::kMin)->wait();
  const double t_exposed = waits.narrow(0, o.warmup, steps).mean().item<double>();

  // The same bytes in the same buckets, all-reduced with nothing else running.
  std::vector<at::Tensor> flats;
  int64_t bytes = 0;
  const auto params = ddp.parameters();
  for (const auto& bucket : ddp.bucket_indices()) {
    int64_t numel = 0;
    for (size_t i : bucket) numel += params[i].numel();
    flats.push_back(at::zeros({numel}));
    bytes += numel * 4;
  }
  const double t_comm = time_steps(group, o.warmup, steps, [&](int) {
    std::vector<std::shared_ptr<Work>> works;
    for (at::Tensor& f : flats) works.push_back(group.all_reduce(f));
    for (auto& w : works) w->wait();
  });

  if (rank == 0) {
    // Measured inside the DDP step, so the step-to-step noise of compute does not enter it.
    const double hidden = world > 1 ? std::min(1.0, std::max(0.0, 1.0 - t_exposed / t_comm)) : 0.0;
    std::printf("datapar bench ddp: model %s, backend %s, %d process(es) x %d thread(s), batch %d per rank, %d steps\n",
                o.model.c_str(), group.backend().c_str(), world, at::get_num_threads(), batch, steps);
    std::printf("local step (no synchronisation): %.2f ms, %.0f samples/s over all ranks (the ceiling)\n",
                t_local * 1e3, world * batch / t_local);
    std::printf("ddp step: %.2f ms (%.2f of the ceiling)\n", t_ddp * 1e3, t_local / t_ddp);
    std::printf("all-reduce of the gradients alone: %.2f ms (%zu buckets, %.2f MB)\n", t_comm * 1e3, flats.size(),
                bytes / 1e6);
    std::printf("all-reduce time hidden behind backward: %.0f%% (backward waited %.2f ms per step for its buckets "
                "after its last gradient, on the rank that finished backward last)\n",
                hidden * 100, t_exposed * 1e3);
    std::printf("samples/s: %.0f\n", world * batch / t_ddp);
  }
  return 0;
}

int run_rank(const BenchDdpOptions& o, const std::string& init, int rank, int world) {
  at::set_num_threads(o.threads);
  tune_cpu_allocator();
  init_process_group(o.backend, init, rank, world, std::chrono::minutes(5));
  ProcessGroup& group = *default_group();
  int code = 1;
  if (o.model == "mlp") {
    code = run_model<models::Mlp>(o, o.batch ? o.batch : 64, o.steps ? o.steps : 200, group,
                                  [] { return models::Mlp(); });
  } else if (o.model == "lenet") {
    code = run_model<models::LeNet>(o, o.batch ? o.batch : 128, o.steps ? o.steps : 50, group,
                                    [] { return models::LeNet(); });
  } else if (o.model == "resnet18") {
    code = run_model<models::ResNet18>(o, o.batch ? o.batch : 32, o.steps ? o.steps : 10, group,
                                       [] { return models::ResNet18(); });
  }
  destroy_process_group();
  return code;
}

}  // namespace

int bench_ddp(const BenchDdpOptions& given) {
  BenchDdpOptions options = given;
  if (options.backend.empty()) options.backend = default_backend();  // mpi under mpirun
  DATAPAR_CHECK(options.model == "mlp" || options.model == "lenet" || options.model == "resnet18", "--model: \"",
                options.model, "\" is not one of mlp, lenet, resnet18.");
  DATAPAR_CHECK(options.batch >= 0 && options.steps >= 0 && options.threads >= 1,
                "--batch, --steps and --threads must not be negative (threads at least 1).");
  return run_job(
      options.nproc, "datapar bench ddp",
      [&](const std::string& init, int rank, int world) { return run_rank(options, init, rank, world); },
      options.backend);
}

}  // namespace datapar::tools
