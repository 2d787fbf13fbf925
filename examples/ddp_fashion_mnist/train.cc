// Data-parallel training on Fashion-MNIST with DistributedDataParallel: one process per
// device, each on its own share of every batch, gradients averaged over the processes.
// Copy this file to start a trainer of your own.
//
//   build/bin/datapar launch --nproc-per-node 2 -- build/bin/ddp_fashion_mnist --epochs 2
//
// Under the launcher each process finds its rank in the environment (RANK, WORLD_SIZE,
// LOCAL_RANK). On a machine with CUDA devices each process takes cuda:LOCAL_RANK; elsewhere
// all run on the CPU. --batch-size is per process: N processes of batch B step as one of
// batch N*B, so the loss they print is the one a single process prints with that batch.
#include <CLI/CLI.hpp>
#include <torch/cuda.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "datapar/datapar.h"
#include "datapar/data/distributed_sampler.h"
#include "datapar/data/fashion_mnist.h"
#include "datapar/data/loader.h"

// A small network of your own: 784 -> 256 -> 10.
struct NetImpl : torch::nn::Module {
  NetImpl() : hidden(register_module("hidden", torch::nn::Linear(784, 256))),
              out(register_module("out", torch::nn::Linear(256, 10))) {}
  at::Tensor forward(const at::Tensor& images) {
    return out(torch::nn::functional::relu(hidden(images.flatten(1))));
  }
  torch::nn::Linear hidden, out;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  CLI::App app{"DistributedDataParallel on Fashion-MNIST; start it with datapar launch"};
  std::string data = DATAPAR_SHIPPED_FASHION_MNIST_DIR;  // the repository's 6000 + 1000 images
  int epochs = 2;
  int64_t batch_size = 32;
  double lr = 0.1;
  app.add_option("--data", data, "Directory of the Fashion-MNIST IDX files");
  app.add_option("--epochs", epochs, "Passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "Images per step on each process")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    // 1. Join the job. The backend: NCCL between GPUs where this build has it, else Gloo.
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

    // 3. The model, wrapped: DDP copies rank 0's parameters to every process, and each
    //    backward averages the gradients over the processes.
    torch::manual_seed(0);  // the same start for every run (DDP gives every process rank 0's)
    Net net;
    net->to(device);
    datapar::DistributedDataParallel model(net);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(lr));

    for (int epoch = 1; epoch <= epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      // 4. Train: next batch, forward, backward, step.
      sampler.set_epoch(epoch);  // a new shuffle each epoch, the same on every process
      train_loader.start_epoch(sampler);
      double loss_sum = 0, trained = 0;
      while (auto batch = train_loader.next()) {
        const at::Tensor x = batch->data.to(device), y = batch->target.to(device);
        optimizer.zero_grad();
        const at::Tensor loss = torch::nn::functional::cross_entropy(model(x), y);
        loss.backward();
        optimizer.step();
        loss_sum += loss.item<double>() * static_cast<double>(batch->size());
        trained += static_cast<double>(batch->size());
      }

      // 5. Evaluate exactly: each process its share of the test set, padding skipped.
      double right = 0, tested = 0;
      {
        torch::NoGradGuard no_grad;
        test_sampler.set_epoch(epoch);  // rewinds it: the loader consumed it last epoch
        test_loader.start_epoch(test_sampler);
        while (auto batch = test_loader.next()) {
          const at::Tensor real = batch->is_padding.logical_not();
          const at::Tensor hit = model(batch->data.to(device)).argmax(1).cpu().eq(batch->target) & real;
          right += hit.sum().item<double>();
          tested += real.sum().item<double>();
        }
      }

      // 6. Report the whole job's numbers: sums over the processes.
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
    std::fprintf(stderr, "ddp_fashion_mnist: %s\n", e.what());
    return 1;
  }
}
