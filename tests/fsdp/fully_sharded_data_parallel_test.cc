// FullyShardedDataParallel with its ranks as threads of one process (Gloo over loopback, so
// the TSan suite runs it too): training equals one process training on every rank's batch,
// with the parameters sharded between steps, at world sizes that do and do not divide the
// parameter count.
#include "datapar/fsdp/fully_sharded_data_parallel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <mutex>
#include <tuple>
#include <vector>

#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"

namespace datapar {
namespace {

// The default generator is not thread-safe, and constructing a module draws from it.
std::mutex g_generator;

torch::nn::Sequential mlp(uint64_t seed) {
  const std::lock_guard<std::mutex> lock(g_generator);
  torch::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(10, 20), torch::nn::ReLU(), torch::nn::Linear(20, 5));
  model->to(at::kDouble);  // 325 parameters: padded to 326 for 2 ranks, 327 for 3
  return model;
}

// Rank r's batch at `step`: 3 + r rows (uneven), the same on every rank's thread.
at::Tensor batch(int r, int step) {
  return at::sin(at::arange(10 * (3 + r), at::kDouble).view({3 + r, 10}) * (0.1 * (r + 1)) + step);
}

// Averaged per rank, as DDP and FSDP average: the mean over ranks of each rank's mean loss.
at::Tensor loss(const at::Tensor& out) { return out.pow(2).mean(); }

void expect_training_equals_one_process(int world, FsdpOptions options) {
  constexpr int kSteps = 5;
  // One process: the same model (rank 0's), the gradient the mean over ranks of their losses'.
  torch::nn::Sequential reference = mlp(0);
  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int r = 0; r < world; ++r) total = total + loss(reference->forward(batch(r, step)));
    (total / world).backward();
    sgd.step();
  }
  std::vector<at::Tensor> want;
  for (const at::Tensor& p : reference->parameters()) want.push_back(p.detach().reshape({-1}));
  const at::Tensor want_flat = at::cat(want);

  testing::run_gloo_ranks(world, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = mlp(rank);  // different: FSDP starts every rank from rank 0's
    FullyShardedDataParallel fsdp(model, group, options);
    EXPECT_FALSE(fsdp.gathered()) << "sharded after construction";
    // The module's own forward, outside fsdp's, finds no parameters: an error, not garbage.
    EXPECT_ANY_THROW(model->forward(batch(rank, 0)));
    EXPECT_EQ(fsdp.shard_numel(), (325 + world - 1) / world);
    torch::optim::SGD opt(fsdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      const at::Tensor out = fsdp.forward(batch(rank, step));
      EXPECT_EQ(fsdp.gathered(), !options.reshard_after_forward) << "between forward and backward";
      loss(out).backward();
      EXPECT_FALSE(fsdp.gathered()) << "after backward";
      opt.step();
    }
    // Rank r's shard is the reference's flat parameters [r * shard, (r + 1) * shard).
    const at::Tensor shard = fsdp.parameters()[0].detach();
    const int64_t begin = rank * shard.numel();
    const int64_t real = std::max<int64_t>(0, std::min<int64_t>(shard.numel(), want_flat.numel() - begin));
    EXPECT_TRUE(at::allclose(shard.narrow(0, 0, real), want_flat.narrow(0, begin, real), 1e-12, 1e-12))
        << "rank " << rank << " of " << world;
    // And the module's own parameters, gathered for an evaluation forward, are the reference's.
    const at::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(fsdp.forward(batch(0, 0)), reference->forward(batch(0, 0)), 1e-12, 1e-12));
  });
}

TEST(FullyShardedDataParallel, TrainsAsOneProcessAtTwoRanks) { expect_training_equals_one_process(2, {}); }

TEST(FullyShardedDataParallel, TrainsAsOneProcessAtThreeRanksWithPadding) {
  expect_training_equals_one_process(3, {});
}

TEST(FullyShardedDataParallel, KeepingTheParametersAfterForwardTrainsTheSame) {
  FsdpOptions keep;
  keep.reshard_after_forward = false;
  expect_training_equals_one_process(2, keep);
}

// A module that returns a tuple: its tensors are found, and backward gathers again.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl()
      : body(register_module("body", torch::nn::Linear(4, 6))),
        head(register_module("head", torch::nn::Linear(6, 2))) {}
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x) {
    const at::Tensor h = torch::relu(body->forward(x));
    return {head->forward(h), h.sum(1)};
  }
  torch::nn::Linear body, head;
};
TORCH_MODULE(TwoHeads);

TEST(FullyShardedDataParallel, GathersForTheBackwardOfATupleOfOutputs) {
  const at::Tensor x = at::randn({3, 4});
  TwoHeads plain;
  {
    const std::lock_guard<std::mutex> lock(g_generator);
    plain = TwoHeads();
  }
  auto [a, b] = plain->forward(x);
  (a.pow(2).sum() + b.sum()).backward();
  std::vector<at::Tensor> want;
  for (const at::Tensor& p : plain->parameters()) want.push_back(p.grad().reshape({-1}));
  testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    TwoHeads model;
    {
      const std::lock_guard<std::mutex> lock(g_generator);
      model = TwoHeads();
    }
    const at::NoGradGuard copy;
    for (size_t i = 0; i < model->parameters().size(); ++i) model->parameters()[i].copy_(plain->parameters()[i]);
    const at::AutoGradMode train(true);
    FullyShardedDataParallel fsdp(model, group);
    auto [c, d] = fsdp.forward(x);
    (c.pow(2).sum() + d.sum()).backward();
    EXPECT_TRUE(at::allclose(fsdp.parameters()[0].grad(), at::cat(want)));
  });
}

TEST(FullyShardedDataParallel, RefusesModulesOfMixedDtypes) {
  testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
    model[1]->to(at::kDouble);
    EXPECT_THROW_MSG(FullyShardedDataParallel(model, group), InvalidArgumentError, "mix Float");
  });
}

}  // namespace
}  // namespace datapar
