// A DCP checkpoint saved in the background while training goes on (issue 49): ResNet-18 or a
// large MLP with Adam, 2 ranks (processes forked here, gloo over loopback, a file store). Per
// round and rank: training steps alone (the pace without a save), a synchronous dcp::save, then
// a dcp::AsyncSaver save with training steps for as long as it is in flight. Prints the
// medians (slowest rank) of: the synchronous save, what the asynchronous one blocked the step
// for, its whole write, and the steps' pace during the write against the pace without.
// bench/torch_async_save.py does the same with PyTorch's dcp.save and dcp.async_save;
// bench/async_save_ab.sh runs both in turn.
//
//   build/bin/async_save_bench DIR [--model resnet18|mlp] [--rounds 3] [--ranks 2]
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "child_process.h"
#include "rank_times.h"
#include "datapar/dcp/async_save.h"
#include "datapar/dcp/checkpoint.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/prefix_store.h"

namespace {

using datapar::bench::median;
using datapar::bench::slowest;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The model of the run and a batch for it: ResNet-18 (d2l's, Fashion-MNIST's 1x28x28, batch
// 32) or an MLP of 143 M parameters (572 MB; 1.7 GB with Adam's moments, batch 8).
struct Job {
  std::shared_ptr<torch::nn::Module> model;
  std::function<at::Tensor()> forward;
};

Job make_job(const std::string& name) {
  if (name == "mlp") {
    auto mlp = std::make_shared<datapar::models::MlpImpl>(std::vector<int64_t>{1024, 8192, 8192, 8192, 10});
    const at::Tensor x = at::randn({8, 1024});
    return {mlp, [mlp, x] { return mlp->forward(x); }};
  }
  auto resnet = std::make_shared<datapar::models::ResNet18Impl>(10, 1);
  const at::Tensor x = at::randn({32, 1, 28, 28});
  return {resnet, [resnet, x] { return resnet->forward(x); }};
}

int rank_main(int rank, int ranks, const std::string& dir, const std::string& model_name, int rounds) {
  using namespace std::chrono_literals;
  const auto no_env = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  datapar::Rendezvous rdzv = datapar::rendezvous("file://" + dir + "/store", rank, ranks, 60s, no_env);
  auto group = datapar::new_gloo_process_group(rdzv.store, rank, ranks, {"127.0.0.1", 600s, false});
  // The saver's own group: its exchanges run on the writer's thread (datapar/dcp/async_save.h).
  auto saver_group = datapar::new_gloo_process_group(std::make_shared<datapar::PrefixStore>("saver", rdzv.store),
                                                     rank, ranks, {"127.0.0.1", 600s, false});
  at::set_num_threads(1);
  torch::manual_seed(0);
  Job job = make_job(model_name);
  torch::optim::Adam adam(job.model->parameters(), torch::optim::AdamOptions(1e-3));
  const auto step = [&] {
    adam.zero_grad();
    job.forward().pow(2).mean().backward();
    adam.step();
  };
  step();  // Adam's moments exist
  datapar::dcp::State state;
  datapar::dcp::add_module(state, "model", *job.model);
  datapar::dcp::add_optimizer(state, "optim", adam, *job.model);
  datapar::dcp::AsyncSaver saver(saver_group);
  std::vector<double> syncs, blocked, writes, paces, steps_during;
  for (int r = 0; r < rounds; ++r) {
    // The pace without a save.
    group->barrier()->wait();
    auto start = Clock::now();
    for (int i = 0; i < 3; ++i) step();
    const double alone = seconds_since(start) / 3;
    // A synchronous save.
    group->barrier()->wait();
    start = Clock::now();
    datapar::dcp::save(state, dir + "/sync" + std::to_string(r), *group);
    syncs.push_back(slowest(*group, seconds_since(start)));
    // The same state saved in the background, training meanwhile.
    group->barrier()->wait();
    start = Clock::now();
    saver.save(state, dir + "/async" + std::to_string(r));
    const double blocked_for = seconds_since(start);
    int steps = 0;
    double stepping = 0;
    while (saver.in_flight()) {
      const auto s = Clock::now();
      step();
      stepping += seconds_since(s);
      ++steps;
    }
    saver.wait();
    const double written = seconds_since(start);
    blocked.push_back(slowest(*group, blocked_for));
    writes.push_back(slowest(*group, written));
    // The steps' pace during the write against without (1: unchanged); the slowest rank's.
    const double pace = steps > 0 ? alone / (stepping / steps) : 1.0;
    paces.push_back(-slowest(*group, -pace));
    steps_during.push_back(steps);
    group->barrier()->wait();
  }
  if (rank == 0) {
    std::printf("datapar dcp, %d ranks, %s + adam: sync save %.1f ms; async save blocked %.1f ms (%.3f of sync), "
                "written in %.1f ms; training pace during the write %.3f of without (%.0f steps) "
                "(medians of %d, slowest rank); staging %.1f MiB\n",
                ranks, model_name.c_str(), median(syncs) * 1e3, median(blocked) * 1e3,
                median(blocked) / median(syncs), median(writes) * 1e3, median(paces), median(steps_during), rounds,
                saver.staging_bytes() / 1048576.0);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A DCP checkpoint saved in the background while training goes on, against a synchronous save"};
  std::string dir, model = "resnet18";
  int rounds = 3, ranks = 2;
  app.add_option("dir", dir, "An empty directory for the checkpoints")->required();
  app.add_option("--model", model)->check(CLI::IsMember({"resnet18", "mlp"}));
  app.add_option("--rounds", rounds);
  app.add_option("--ranks", ranks);
  CLI11_PARSE(app, argc, argv);
  const auto exits = datapar::detail::fork_ranks(
      ranks, [&](int rank) { return rank_main(rank, ranks, dir, model, rounds); }, "async_save_bench");
  for (const auto& e : exits) {
    if (e.exit_code != 0) return 1;
  }
  return 0;
}
