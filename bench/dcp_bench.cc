// Saving and loading a DCP checkpoint (datapar/dcp/checkpoint.h) of ResNet-18 + Adam state
// with 2 ranks (processes forked here, gloo over loopback, a file store): per round, a save
// into a new directory and a load of it into freshly made state; prints the medians of the
// slowest rank's times and the bytes each rank wrote. bench/torch_dcp.py does the same with
// PyTorch's dcp.save / dcp.load; bench/dcp_ab.sh runs both in turn.
//
//   build/bin/dcp_bench DIR [--rounds 5] [--ranks 2]
#include <sys/stat.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "child_process.h"
#include "rank_times.h"
#include "datapar/dcp/checkpoint.h"
#include "datapar/models/resnet18.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/init_method.h"

namespace {

using datapar::bench::median;
using datapar::bench::slowest;
using Clock = std::chrono::steady_clock;

int rank_main(int rank, int ranks, const std::string& dir, int rounds) {
  using namespace std::chrono_literals;
  const auto no_env = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  datapar::Rendezvous rdzv = datapar::rendezvous("file://" + dir + "/store", rank, ranks, 60s, no_env);
  auto group = datapar::new_gloo_process_group(rdzv.store, rank, ranks, {"127.0.0.1", 300s, false});
  at::set_num_threads(1);
  torch::manual_seed(0);
  datapar::models::ResNet18 model(10, 1);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  adam.zero_grad();
  model->forward(at::randn({8, 1, 96, 96})).sum().backward();
  adam.step();
  std::vector<double> saves, loads;
  int64_t bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    const std::string ck = dir + "/ck" + std::to_string(r);
    datapar::dcp::State state;
    datapar::dcp::add_module(state, "model", *model);
    datapar::dcp::add_optimizer(state, "optim", adam, *model);
    group->barrier()->wait();
    auto start = Clock::now();
    datapar::dcp::save(state, ck, *group);
    saves.push_back(slowest(*group, std::chrono::duration<double>(Clock::now() - start).count()));
    struct stat st {};
    if (::stat((ck + "/__" + std::to_string(rank) + "_0.distcp").c_str(), &st) == 0) bytes = st.st_size;

    datapar::models::ResNet18 fresh(10, 1);
    torch::optim::Adam fresh_adam(fresh->parameters(), torch::optim::AdamOptions(1e-3));
    datapar::dcp::State target;
    datapar::dcp::add_module(target, "model", *fresh);
    datapar::dcp::add_optimizer(target, "optim", fresh_adam, *fresh);
    group->barrier()->wait();
    start = Clock::now();
    datapar::dcp::load(target, ck, *group);
    datapar::dcp::apply_optimizer(target, "optim", fresh_adam, *fresh);
    loads.push_back(slowest(*group, std::chrono::duration<double>(Clock::now() - start).count()));
  }
  std::printf("rank %d wrote %.2f MiB\n", rank, bytes / 1048576.0);
  if (rank == 0) {
    std::printf("datapar dcp, %d ranks, resnet18 + adam: save %.1f ms, load %.1f ms (median of %d, slowest rank)\n",
                ranks, median(saves) * 1e3, median(loads) * 1e3, rounds);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Save and load time of a DCP checkpoint of ResNet-18 + Adam"};
  std::string dir;
  int rounds = 5, ranks = 2;
  app.add_option("dir", dir, "An empty directory for the checkpoints")->required();
  app.add_option("--rounds", rounds);
  app.add_option("--ranks", ranks);
  CLI11_PARSE(app, argc, argv);
  const auto exits = datapar::detail::fork_ranks(
      ranks, [&](int rank) { return rank_main(rank, ranks, dir, rounds); }, "dcp_bench");
  for (const auto& e : exits) {
    if (e.exit_code != 0) return 1;
  }
  return 0;
}
