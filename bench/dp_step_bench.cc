// One training step (forward, loss, backward, SGD) at batch 256: DataParallel on CPU devices
// (with shared and with copy replicas) against the bare module with 1 and with 2 intra-op
// threads, in one run.
//
// The variants take turns, round after round, so that a noisy neighbour slows them all
// alike; each variant's figure is the median over rounds of its mean step time. Ratios are
// what docs/benchmarks.md reports.
//
// Every variant runs in the same process under the same allocator settings: by default
// datapar::tune_cpu_allocator() (see cpu_allocator.h), --default-allocator to leave glibc as is.
// The DataParallel variants leave the calling thread at 1 intra-op thread: it only splits,
// gathers and steps the optimizer, and an idle OpenMP team of the caller spin-waits on the
// cores the devices' threads need.
//
//   build/bin/dp_step_bench [--model mlp|lenet|all] [--rounds 15] [--steps 10] [--default-allocator]
//   build/bin/dp_step_bench --solo --model mlp --batch 128   # the bare module alone, 1 thread:
//       bench/process_ceiling.sh runs it as one process and as two at once
#include <CLI/CLI.hpp>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "datapar/datapar.h"
#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "parallel/device_workers.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Variant {
  std::string name;
  int main_threads;                 // intra-op threads of the calling thread
  std::function<void()> step;       // one training step
  std::vector<double> round_ms;     // mean step time of each round
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A training step for `forward` over parameters `params`.
template <typename Forward>
std::function<void()> make_step(Forward forward, std::vector<at::Tensor> params, at::Tensor x, at::Tensor y) {
  auto sgd = std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.01));
  return [=]() mutable {
    sgd->zero_grad();
    at::cross_entropy_loss(forward(x), y).backward();
    sgd->step();
  };
}

template <typename ModuleHolder>
void bench_model(const std::string& model_name, int rounds, int steps, int batch) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({batch, 1, 28, 28});
  const at::Tensor y = torch::randint(0, 10, {batch});

  ModuleHolder bare1, bare2, single, dual, dual_copy, dual_copy_apart;
  datapar::DataParallel dp1(single, datapar::cpu_devices(1));
  datapar::DataParallel dp2(dual, datapar::cpu_devices(2));
  datapar::DataParallelOptions copy_options;
  copy_options.devices = datapar::cpu_devices(2);
  copy_options.replicas = datapar::ReplicaStorage::kCopy;  // the path of several GPUs
  datapar::DataParallel dp2_copy(dual_copy, copy_options);
  // The same, but each master parameter pointed at memory of its own after replication (as a
  // user's set_data would): the refresh copies parameter by parameter, as before the packing
  // (Note [One copy per replica] in src/parallel/replicate.cc).
  datapar::DataParallel dp2_copy_apart(dual_copy_apart, copy_options);
  {
    const at::NoGradGuard no_grad;
    for (at::Tensor p : dp2_copy_apart.parameters()) p.set_data(p.clone());
  }

  std::vector<Variant> variants;
  variants.push_back({"module, 1 thread", 1, make_step([bare1](const at::Tensor& t) mutable { return bare1(t); }, bare1->parameters(), x, y), {}});
  variants.push_back({"module, 2 threads", 2, make_step([bare2](const at::Tensor& t) mutable { return bare2(t); }, bare2->parameters(), x, y), {}});
  variants.push_back({"DataParallel, 1 device (1 thread)", 1, make_step([&dp1](const at::Tensor& t) { return dp1(t); }, dp1.parameters(), x, y), {}});
  variants.push_back({"DataParallel, 2 CPU devices", 1, make_step([&dp2](const at::Tensor& t) { return dp2(t); }, dp2.parameters(), x, y), {}});
  variants.push_back({"DataParallel, 2 CPU devices, copy replicas", 1, make_step([&dp2_copy](const at::Tensor& t) { return dp2_copy(t); }, dp2_copy.parameters(), x, y), {}});
  variants.push_back({"DataParallel, 2 CPU devices, copy replicas, copied per parameter", 1,
                      make_step([&dp2_copy_apart](const at::Tensor& t) { return dp2_copy_apart(t); },
                                dp2_copy_apart.parameters(), x, y),
                      {}});

  // The ceiling: each CPU device's thread trains a private copy on half the batch, nothing
  // shared and nothing summed: what two unsynchronised workers would reach.
  auto workers = datapar::detail::DeviceWorkers::for_devices(
      datapar::cpu_devices(2), datapar::detail::pin_cpu_devices(datapar::process_environment()));
  std::vector<std::function<void()>> halves;
  for (int64_t i = 0; i < 2; ++i) {
    ModuleHolder copy;
    const int64_t rows = batch / 2;
    halves.push_back(make_step([copy](const at::Tensor& t) mutable { return copy(t); }, copy->parameters(),
                               x.narrow(0, i * rows, rows), y.narrow(0, i * rows, rows)));
  }
  variants.push_back({"ceiling: 2 CPU devices, no gradient sum", 1,
                      [workers, halves] { workers->run(2, [&](size_t i) { halves[i](); }, "ceiling"); }, {}});

  for (auto& v : variants) {  // warm up: allocator, OpenMP teams, replicas
    at::set_num_threads(v.main_threads);
    for (int i = 0; i < 3; ++i) v.step();
  }
  for (int r = 0; r < rounds; ++r) {
    for (auto& v : variants) {
      at::set_num_threads(v.main_threads);
      const auto start = Clock::now();
      for (int i = 0; i < steps; ++i) v.step();
      v.round_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps);
    }
  }

  std::printf("\n%s, batch %d, %d rounds x %d steps (median of round means)\n", model_name.c_str(), batch, rounds, steps);
  std::printf("| variant | ms/step | samples/s |\n|---|---|---|\n");
  std::map<std::string, double> ms;
  for (auto& v : variants) {
    ms[v.name] = median(v.round_ms);
    std::printf("| %s | %.2f | %.0f |\n", v.name.c_str(), ms[v.name], batch * 1000.0 / ms[v.name]);
  }
  const double one = ms["module, 1 thread"];
  const double two = ms["module, 2 threads"];
  std::printf("ratios: DataParallel(2 devices) vs module(1 thread) %.2fx (goal >= 1.6), vs module(2 threads) %.2fx (goal >= 1.0 for LeNet); "
              "DataParallel(1 device) / module(1 thread) time %.3f (goal <= 1.05)\n",
              one / ms["DataParallel, 2 CPU devices"], two / ms["DataParallel, 2 CPU devices"],
              ms["DataParallel, 1 device (1 thread)"] / one);
  std::printf("copy replicas (refreshed every forward) / shared replicas time %.3f; one copy per dtype / one per "
              "parameter time %.3f\n",
              ms["DataParallel, 2 CPU devices, copy replicas"] / ms["DataParallel, 2 CPU devices"],
              ms["DataParallel, 2 CPU devices, copy replicas"] /
                  ms["DataParallel, 2 CPU devices, copy replicas, copied per parameter"]);
  std::printf("ceiling (2 unsynchronised half-batch workers) vs module(1 thread) %.2fx; DataParallel reaches %.0f%% of it\n",
              one / ms["ceiling: 2 CPU devices, no gradient sum"],
              100.0 * ms["ceiling: 2 CPU devices, no gradient sum"] / ms["DataParallel, 2 CPU devices"]);
}

// Trains the bare module alone on 1 intra-op thread and prints its ms/step.
template <typename ModuleHolder>
void solo(int steps, int batch) {
  at::set_num_threads(1);
  ModuleHolder model;
  const at::Tensor x = torch::randn({batch, 1, 28, 28});
  const at::Tensor y = torch::randint(0, 10, {batch});
  auto step = make_step([model](const at::Tensor& t) mutable { return model(t); }, model->parameters(), x, y);
  for (int i = 0; i < 5; ++i) step();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  std::printf("%.3f\n", std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DataParallel training-step benchmark on CPU devices"};
  std::string model = "all";
  int rounds = 15;
  int steps = 10;
  int batch = 256;
  bool default_allocator = false;
  bool solo_mode = false;
  app.add_flag("--solo", solo_mode, "Only train the bare module (--model mlp or lenet) for --steps steps; print ms/step");
  app.add_flag("--default-allocator", default_allocator, "Leave glibc malloc's settings as they are");
  app.add_option("--model", model, "mlp, lenet or all (default all)")->check(CLI::IsMember({"mlp", "lenet", "all"}));
  app.add_option("--rounds", rounds, "Rounds; each runs every variant once (default 15)")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "Training steps per variant per round (default 10)")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "Batch size (default 256)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const bool tuned = !default_allocator && datapar::tune_cpu_allocator();
  if (solo_mode) {
    if (model == "lenet") {
      solo<datapar::models::LeNet>(steps, batch);
    } else {
      solo<datapar::models::Mlp>(steps, batch);
    }
    return 0;
  }
  std::printf("cores: %u, libtorch parallel backend: %s, allocator: %s\n", std::thread::hardware_concurrency(),
              at::get_parallel_info().find("OpenMP") != std::string::npos ? "OpenMP" : "other",
              tuned ? "glibc, datapar::tune_cpu_allocator()" : "glibc defaults");
  if (model == "mlp" || model == "all") bench_model<datapar::models::Mlp>("MLP 784-512-512-10", rounds, steps, batch);
  if (model == "lenet" || model == "all") bench_model<datapar::models::LeNet>("LeNet (d2l)", rounds, steps, batch);
  return 0;
}
