// Fault-tolerant DDP on Fashion-MNIST: training that goes on when a process dies or hangs,
// and ends with the model an undisturbed run ends with. Copy this file to start a trainer
// of your own.
//
//   build/bin/datapar launch --fault-tolerant --nproc-per-node 2 --max-restarts 1 -- \
//       build/bin/ft_ddp_fashion_mnist --epochs 3
//
// The launcher serves the job's store and decides who is a member (docs/fault_tolerance.md).
// A worker that dies is restarted alone and takes the model and optimizer state from a live
// one; the others go on, from their memory, without a checkpoint. Each step trains one global
// batch, defined by the step alone and cut into a slice per process of the full job; a
// member alone trains the slices of those missing, and the slices' gradients are summed in
// order, so the model does not depend on who was alive, to the bit.
#include <CLI/CLI.hpp>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>

#include "datapar/data/balanced_batches.h"
#include "datapar/data/fashion_mnist.h"
#include "datapar/datapar.h"

// A small network of your own: 784 -> 256 -> 10.
struct NetImpl : torch::nn::Module {
  NetImpl() : hidden(register_module("hidden", torch::nn::Linear(784, 256))),
              out(register_module("out", torch::nn::Linear(256, 10))) {}
  at::Tensor forward(const at::Tensor& images) {
    return out(torch::nn::functional::relu(hidden(images.flatten(1))));
  }
  torch::nn::Linear hidden, out;
};

// The test set's mean loss and accuracy. Every member holds the same model after a
// committed step, so one evaluates it alone.
std::pair<double, double> evaluate(NetImpl& net, const datapar::FashionMnist& test_set) {
  torch::NoGradGuard no_grad;
  const datapar::Batch all = test_set.get_batch(torch::arange(test_set.size()));
  const at::Tensor logits = net.forward(all.data);
  const double loss = torch::nn::functional::cross_entropy(logits, all.target).item<double>();
  const double accuracy = logits.argmax(1).eq(all.target).to(torch::kFloat64).mean().item<double>();
  return {loss, accuracy};
}

int main(int argc, char** argv) {
  CLI::App app{"Fault-tolerant DDP on Fashion-MNIST; start it with datapar launch --fault-tolerant"};
  std::string data = DATAPAR_SHIPPED_FASHION_MNIST_DIR;  // the repository's 6000 + 1000 images
  int epochs = 3;
  int64_t batch_size = 64;
  double lr = 0.02;
  app.add_option("--data", data, "Directory of the Fashion-MNIST IDX files");
  app.add_option("--epochs", epochs, "Passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "Images per step, over the whole job")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate (momentum 0.9)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    // 1. Join the job: the launcher's store, and this worker's membership.
    datapar::ft::LaunchedJob job = datapar::ft::join_launched_job();
    const int slices = job.world_size;  // the full job's size: each process trains one slice

    // 2. Data: every member reads the files. Step s of an epoch takes the s-th global batch of
    //    the epoch's shuffle (the same on every member), whoever is alive.
    datapar::FashionMnistOptions split;
    split.root = data;
    split.normalize = true;
    const datapar::FashionMnist train_set(split);
    split.train = false;
    const datapar::FashionMnist test_set(split);
    datapar::BalancedBatches batches({train_set.size(), batch_size, slices, 0, /*shuffle=*/true, /*seed=*/0});
    const int64_t per_epoch = batches.num_steps(), total = per_epoch * epochs;

    // 3. The model and optimizer, wrapped. Members that start together begin from the first
    //    member's parameters; one that joins later takes them, and the momentum, from a live one.
    torch::manual_seed(0);
    auto net = std::make_shared<NetImpl>();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
    datapar::ft::FaultTolerantDdp<NetImpl> trainer(net, sgd, *job.elastic, slices);

    // 4. Train step by step. A step a member failed in is not committed: train_step returns
    //    false and the same step is trained again over the new membership.
    while (trainer.step() < total) {
      const bool committed = trainer.train_step([&](NetImpl& model, const datapar::ft::Slice& slice) {
        const int64_t step = trainer.step();  // the step being trained (a joiner takes it from the others)
        if (batches.epoch() != step / per_epoch) batches.set_epoch(step / per_epoch);
        const at::Tensor rows = batches.global_batch(step % per_epoch);
        const at::Tensor mine = rows.slice(0, slice.begin(rows.size(0)), slice.end(rows.size(0)));
        const datapar::Batch batch = train_set.get_batch(mine);
        torch::nn::functional::cross_entropy(model.forward(batch.data), batch.target).backward();
        return mine.size(0);  // the loss is the mean over these rows
      });

      // 5. At an epoch's end, the first member reports.
      if (committed && trainer.step() % per_epoch == 0 && trainer.elastic().rank() == 0) {
        const auto [loss, accuracy] = evaluate(*net, test_set);
        std::printf("epoch %lld: test loss %.6f, test accuracy %.4f (%lld images), %d members\n",
                    static_cast<long long>(trainer.step() / per_epoch), loss, accuracy,
                    static_cast<long long>(test_set.size()), trainer.elastic().size());
        std::fflush(stdout);
      }
    }
    trainer.finish();  // waits until every member is done, so none is left in a vote
    return 0;
  } catch (const datapar::ft::TrainingComplete&) {
    return 0;  // a replacement that came after the others finished: nothing left to do
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ft_ddp_fashion_mnist: %s\n", e.what());
    return 1;
  }
}
