// What activation checkpointing (datapar/autograd/checkpoint.h) saves and costs: one process
// trains a deep MLP (Linear + ReLU layers) for a few steps, plainly or with each group of
// `--every` layers one checkpointed segment, and prints its peak resident memory and its
// median step time. Peak memory is per process, so bench/checkpoint_ab.sh starts one
// process per mode, the modes taking turns.
//
//   build/bin/checkpoint_bench --mode plain|checkpoint [--layers 16] [--width 2048]
//                              [--batch 2048] [--every 4] [--steps 5]
#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "datapar/autograd/checkpoint.h"

int main(int argc, char** argv) {
  CLI::App app{"Peak memory and step time of an MLP trained plainly or with activation checkpointing"};
  std::string mode = "plain";
  int64_t layers = 16, width = 2048, batch = 2048, every = 4, steps = 5;
  app.add_option("--mode", mode)->check(CLI::IsMember({"plain", "checkpoint"}));
  app.add_option("--layers", layers);
  app.add_option("--width", width);
  app.add_option("--batch", batch);
  app.add_option("--every", every, "Layers per checkpointed segment");
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);

  torch::manual_seed(0);
  at::set_num_threads(1);
  std::vector<torch::nn::Sequential> segments;
  std::vector<at::Tensor> params;
  for (int64_t first = 0; first < layers; first += every) {
    torch::nn::Sequential segment;
    for (int64_t l = first; l < std::min(layers, first + every); ++l) {
      segment->push_back(torch::nn::Linear(width, width));
      segment->push_back(torch::nn::ReLU());
    }
    for (const at::Tensor& p : segment->parameters()) params.push_back(p);
    segments.push_back(segment);
  }
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(1e-4));
  const at::Tensor x = at::randn({batch, width});
  std::vector<double> times;
  for (int64_t step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    sgd.zero_grad();
    at::Tensor h = x;
    for (auto& segment : segments) {
      h = mode == "plain" ? segment->forward(h)
                          : datapar::checkpoint([&segment](const at::Tensor& in) { return segment->forward(in); }, h);
    }
    h.pow(2).mean().backward();
    sgd.step();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  std::printf("mode %s: peak resident %.1f MiB, step %.1f ms (median of %lld)\n", mode.c_str(),
              static_cast<double>(usage.ru_maxrss) / 1024.0, times[times.size() / 2], static_cast<long long>(steps));
  return 0;
}
