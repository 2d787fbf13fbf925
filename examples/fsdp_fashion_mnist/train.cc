// Fully sharded data parallelism on Fashion-MNIST: each process keeps 1/N of the model's
// parameters, gradients and optimizer state; each layer is gathered whole just before it
// runs. Optionally in bf16 (mixed precision), with a sharded checkpoint that PyTorch's
// torch.distributed.checkpoint reads. Copy this file to start a trainer of your own.
//
//   build/bin/datapar launch --nproc-per-node 2 -- build/bin/fsdp_fashion_mnist --epochs 2 \
//       --mp bf16 --checkpoint ck        # and again with --resume: on from the last epoch
//
// As in examples/ddp_fashion_mnist: each process finds its rank in the environment, takes
// cuda:LOCAL_RANK where there are CUDA devices (else the CPU), and --batch-size is per process.
#include <CLI/CLI.hpp>
#include <torch/cuda.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "datapar/datapar.h"
#include "datapar/data/distributed_sampler.h"
#include "datapar/data/fashion_mnist.h"
#include "datapar/data/loader.h"
#include "datapar/dcp/fsdp_state.h"

// A network of your own: 784 -> 512 -> 512 -> 10, each Linear a unit of its own.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : hidden1(register_module("hidden1", torch::nn::Linear(784, 512))),
        hidden2(register_module("hidden2", torch::nn::Linear(512, 512))),
        out(register_module("out", torch::nn::Linear(512, 10))) {}
  at::Tensor forward(const at::Tensor& images) {
    namespace F = torch::nn::functional;
    return out(F::relu(hidden2(F::relu(hidden1(images.flatten(1))))));
  }
  torch::nn::Linear hidden1, hidden2, out;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  CLI::App app{"FullyShardedDataParallel on Fashion-MNIST; start it with datapar launch"};
  std::string data = DATAPAR_SHIPPED_FASHION_MNIST_DIR, mp = "none", checkpoint;
  int epochs = 2;
  int64_t batch_size = 32;
  double lr = 1e-3;
  bool resume = false;
  app.add_option("--data", data, "Directory of the Fashion-MNIST IDX files");
  app.add_option("--epochs", epochs, "Passes over the training set, in all")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "Images per step on each process")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "Adam's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--mp", mp, "Mixed precision: none or bf16 (gathered and computed in bf16, stepped in fp32)")
      ->check(CLI::IsMember({"none", "bf16"}));
  app.add_option("--checkpoint", checkpoint, "Save a sharded checkpoint here after each epoch (DIR/epoch-N)");
  app.add_flag("--resume", resume, "Start from the newest epoch in --checkpoint");
  CLI11_PARSE(app, argc, argv);

  try {
    // 1. Join the job: NCCL between GPUs where this build has it, else Gloo.
    const bool cuda = torch::cuda::is_available();
    datapar::init_process_group(cuda && DATAPAR_HAVE_NCCL ? "nccl" : "");
    const int rank = datapar::get_rank(), world = datapar::get_world_size();
    const char* local_rank = std::getenv("LOCAL_RANK");
    const torch::Device device = cuda ? torch::Device(torch::kCUDA, local_rank ? std::atoi(local_rank) : 0)
                                      : torch::Device(torch::kCPU);

    // 2. Data: every process reads the files; the sampler gives each its own share.
    datapar::FashionMnistOptions split;
    split.root = data;
    split.normalize = true;
    auto train_set = std::make_shared<datapar::FashionMnist>(split);
    split.train = false;
    auto test_set = std::make_shared<datapar::FashionMnist>(split);
    datapar::DistributedSampler sampler({train_set->size(), world, rank, /*shuffle=*/true, /*seed=*/0});
    datapar::DistributedSampler test_sampler(datapar::DistributedSamplerOptions::evaluation(test_set->size(), world, rank));
    datapar::DataLoaderOptions loading;
    loading.batch_size = batch_size;
    loading.num_workers = 1;
    datapar::DataLoader train_loader(train_set, loading), test_loader(test_set, loading);

    // 3. The model, sharded: each Linear a unit, the wrapper the root. Every process builds the
    //    same model; FSDP keeps its 1/N of rank 0's parameters. The optimizer gets the shards.
    torch::manual_seed(0);
    Net net;
    net->to(device);
    datapar::FsdpOptions options;
    if (mp == "bf16") options.param_dtype = at::kBFloat16;  // gathers and computes in bf16
    datapar::fully_shard_each<torch::nn::LinearImpl>(*net, nullptr, options);
    datapar::FullyShardedDataParallel model(net, nullptr, options);
    torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(lr));

    // 4. The checkpoint: each process writes and reads only its shards, in the names of the
    //    whole model (PyTorch's torch.distributed.checkpoint loads it, at any world size).
    auto checkpoint_state = [&] {
      datapar::dcp::State state;
      datapar::dcp::add_fsdp(state, "model", model);
      datapar::dcp::add_fsdp_optimizer(state, "optim", model, optimizer);
      return state;
    };
    int first = 1;
    if (resume) {
      for (int e = epochs; e >= 1 && first == 1; --e) {
        const std::string dir = checkpoint + "/epoch-" + std::to_string(e);
        if (!datapar::dcp::is_checkpoint(dir)) continue;
        datapar::dcp::State state = checkpoint_state();
        datapar::dcp::load(state, dir, *datapar::default_group());
        datapar::dcp::apply_fsdp_optimizer(state, "optim", model, optimizer);
        first = e + 1;
        if (rank == 0) std::printf("resumed from %s\n", dir.c_str());
      }
    }

    for (int epoch = first; epoch <= epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      // 5. Train: next batch, forward, backward, step; the loss in fp32 whatever the compute.
      sampler.set_epoch(epoch);
      train_loader.start_epoch(sampler);
      double loss_sum = 0, trained = 0;
      while (auto batch = train_loader.next()) {
        const at::Tensor x = batch->data.to(device), y = batch->target.to(device);
        optimizer.zero_grad();
        const at::Tensor loss = torch::nn::functional::cross_entropy(model.forward(x).to(at::kFloat), y);
        loss.backward();
        optimizer.step();
        loss_sum += loss.item<double>() * static_cast<double>(batch->size());
        trained += static_cast<double>(batch->size());
      }

      // 6. Evaluate exactly (through the wrapper, which gathers each unit), padding skipped.
      double right = 0, tested = 0;
      {
        torch::NoGradGuard no_grad;
        test_sampler.set_epoch(epoch);
        test_loader.start_epoch(test_sampler);
        while (auto batch = test_loader.next()) {
          const at::Tensor real = batch->is_padding.logical_not();
          const at::Tensor hit = model.forward(batch->data.to(device)).argmax(1).cpu().eq(batch->target) & real;
          right += hit.sum().item<double>();
          tested += real.sum().item<double>();
        }
      }
      if (!checkpoint.empty()) datapar::dcp::save(checkpoint_state(), checkpoint + "/epoch-" + std::to_string(epoch),
                                                  *datapar::default_group());

      // 7. Report the whole job's numbers: sums over the processes.
      at::Tensor totals = torch::tensor({loss_sum, trained, right, tested}, torch::kFloat64).to(device);
      datapar::default_group()->all_reduce(totals)->wait();
      totals = totals.cpu();
      if (rank == 0) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("epoch %d: train loss %.6f, test accuracy %.4f (%lld images), %.1f s, %d processes\n", epoch,
                    totals[0].item<double>() / totals[1].item<double>(),
                    totals[2].item<double>() / totals[3].item<double>(),
                    static_cast<long long>(totals[3].item<double>()), seconds, world);
        std::fflush(stdout);
      }
    }
    datapar::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_fashion_mnist: %s\n", e.what());
    return 1;
  }
}
