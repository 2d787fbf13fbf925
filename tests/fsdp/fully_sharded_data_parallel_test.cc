// FullyShardedDataParallel with its ranks as threads of one process (Gloo over loopback, so
// the TSan suite runs it too): training equals one process training on every rank's batch,
// with the parameters sharded between steps, per unit and for the root, at world sizes that
// do and do not divide the units' sizes; what is gathered at once; state dicts, no_sync,
// clipping, averaging by samples, mixed precision and activation checkpointing.
#include "datapar/fsdp/fully_sharded_data_parallel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "datapar/autograd/checkpoint.h"
#include "datapar/autograd/checkpoint_wrapper.h"
#include "datapar/error.h"
#include "datapar/models/resnet18.h"
#include "datapar/state_dict.h"
#include "datapar/optim/optimizer_state.h"
#include "datapar/train/fsdp_checkpoint.h"
#include "testing/expect_throw.h"
#include "testing/fsdp_net.h"
#include "testing/gloo_ranks.h"

namespace datapar {
namespace {

using Net = testing::FsdpNet;
using testing::fsdp_batch;
using testing::fsdp_net;

// Averaged per rank, as DDP and FSDP average: the mean over ranks of each rank's mean loss.
at::Tensor loss(const at::Tensor& out) { return out.pow(2).mean(); }

int64_t padded(int64_t numel, int world) { return (numel + world - 1) / world * world; }

struct TrainingCase {
  int world = 2;
  FsdpOptions options;
  bool units = true;  // the Sequential's Linears units; otherwise the whole model the root's
  bool adam = false;
};

std::unique_ptr<torch::optim::Optimizer> optimizer(std::vector<at::Tensor> params, bool adam) {
  if (adam) return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

void expect_near(const StateDict& got, const StateDict& want, double tolerance, const std::string& where) {
  ASSERT_EQ(got.keys(), want.keys()) << where;
  for (const auto& item : want) {
    EXPECT_TRUE(at::allclose(got[item.key()], item.value(), tolerance, tolerance)) << where << ": " << item.key();
  }
}

void expect_training_equals_one_process(const TrainingCase& setup) {
  constexpr int kSteps = 5;
  const int world = setup.world;
  // One process: the same model (rank 0's), the gradient the mean over ranks of their losses'.
  Net reference = fsdp_net(0);
  auto reference_optimizer = optimizer(reference->parameters(), setup.adam);
  for (int step = 0; step < kSteps; ++step) {
    reference_optimizer->zero_grad();
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int r = 0; r < world; ++r) total = total + loss(reference->forward(fsdp_batch(r, step)));
    (total / world).backward();
    reference_optimizer->step();
  }
  const StateDict want = state_dict(*reference);

  testing::run_gloo_ranks(world, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(rank);  // different: FSDP starts every rank from rank 0's
    const auto names = model->named_parameters().keys();
    // The Sequential's two Linears are wrapped, the named head sharded in place.
    if (setup.units) EXPECT_EQ(fully_shard_each<torch::nn::LinearImpl>(*model, group, setup.options), 3);
    FullyShardedDataParallel fsdp(model, group, setup.options);
    EXPECT_EQ(model->named_parameters().keys(), names) << "the units keep the model's names";
    EXPECT_EQ(fsdp.units(), setup.units ? 3u : 1u);
    EXPECT_FALSE(fsdp.gathered()) << "sharded after construction";
    // The module's own forward, outside fsdp's, finds no parameters: an error, not garbage.
    EXPECT_ANY_THROW(model->forward(fsdp_batch(rank, 0)));
    const int64_t all = setup.units ? padded(220, world) + padded(420, world) + padded(105, world) : padded(745, world);
    EXPECT_EQ(fsdp.shard_numel() * world, all);
    // Between forward and backward: the head's (sharded in place, kept as the root's own are)
    // or the root's, and without resharding every unit's.
    const int64_t root = setup.units ? padded(105, world) : padded(745, world);
    const int64_t between = setup.options.reshard_after_forward ? root : all;
    auto opt = optimizer(fsdp.parameters(), setup.adam);
    for (int step = 0; step < kSteps; ++step) {
      opt->zero_grad();
      const at::Tensor out = fsdp.forward(fsdp_batch(rank, step));
      EXPECT_EQ(fsdp.gathered_numel(), between) << "between forward and backward";
      loss(out).backward();
      EXPECT_FALSE(fsdp.gathered()) << "after backward";
      opt->step();
    }
    // The unsharded model's state dict, its names and values the reference's.
    expect_near(fsdp.full_state_dict(), want, 1e-10, "rank " + std::to_string(rank));
    // And the module's own parameters, gathered for an evaluation forward, are the reference's.
    const at::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(fsdp.forward(fsdp_batch(0, 0)), reference->forward(fsdp_batch(0, 0)), 1e-10, 1e-10));
    EXPECT_FALSE(fsdp.gathered()) << "after an evaluation forward";
  });
}

TEST(FullyShardedDataParallel, TrainsAsOneProcessAtTwoRanks) { expect_training_equals_one_process({}); }

TEST(FullyShardedDataParallel, TrainsAsOneProcessAtThreeRanksWithPadding) {
  TrainingCase setup;
  setup.world = 3;
  expect_training_equals_one_process(setup);
}

TEST(FullyShardedDataParallel, KeepingTheParametersAfterForwardTrainsTheSame) {
  TrainingCase setup;
  setup.options.reshard_after_forward = false;
  expect_training_equals_one_process(setup);
}

TEST(FullyShardedDataParallel, TheWholeModelAsTheRootsUnitTrainsTheSame) {
  TrainingCase setup;
  setup.units = false;
  expect_training_equals_one_process(setup);
}

TEST(FullyShardedDataParallel, AdamOnTheShardsTrainsAsAdamOnTheModel) {
  TrainingCase setup;
  setup.adam = true;
  setup.world = 3;
  expect_training_equals_one_process(setup);
}

TEST(FullyShardedDataParallel, PrefetchDepthDoesNotChangeTraining) {
  for (int prefetch : {0, 2}) {
    TrainingCase setup;
    setup.options.prefetch = prefetch;
    expect_training_equals_one_process(setup);
  }
}

// Records how much is gathered wherever it sits in the model, in forward and in backward.
struct ProbeImpl : torch::nn::Module {
  explicit ProbeImpl(std::function<void(bool backward)> record) : record(std::move(record)) {}
  at::Tensor forward(const at::Tensor& x) {
    record(false);
    at::Tensor y = x * 1;
    if (y.requires_grad()) {
      y.register_hook([this](const at::Tensor&) { record(true); });
    }
    return y;
  }
  std::function<void(bool)> record;
};
TORCH_MODULE(Probe);

TEST(FullyShardedDataParallel, GathersOnlyTheUnitComputingAndThosePrefetched) {
  constexpr int kLayers = 6;
  constexpr int64_t kUnit = 16 * 16 + 16;  // a Linear(16, 16): 272 elements, even
  for (int prefetch : {0, 1, 2}) {
    testing::run_gloo_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
      std::function<int64_t()> gathered;
      int64_t most_in_forward = 0, most_in_backward = 0;
      auto record = [&](bool backward) {
        int64_t& most = backward ? most_in_backward : most_in_forward;
        most = std::max(most, gathered());
      };
      torch::nn::Sequential model;
      {
        const std::lock_guard<std::mutex> lock(testing::generator_mutex());
        for (int i = 0; i < kLayers; ++i) {
          model->push_back(torch::nn::Linear(16, 16));
          model->push_back(Probe(record));
        }
      }
      FsdpOptions options;
      options.prefetch = prefetch;
      fully_shard_each<torch::nn::LinearImpl>(*model, group, options);
      FullyShardedDataParallel fsdp(model, group, options);
      gathered = [&] { return fsdp.gathered_numel(); };
      for (int step = 0; step < 3; ++step) {
        most_in_forward = most_in_backward = 0;
        fsdp.forward(at::randn({4, 16})).pow(2).sum().backward();
      }
      // At a probe in forward the unit before it is freed and the next `prefetch` are
      // gathered (by the previous iteration's order); in backward, the unit whose gradient
      // is computed next and `prefetch` before it at most. Not the model: 6 units.
      EXPECT_EQ(most_in_forward, prefetch * kUnit) << "prefetch " << prefetch;
      if (prefetch > 0) EXPECT_GE(most_in_backward, kUnit) << "prefetch " << prefetch;
      EXPECT_LE(most_in_backward, (1 + prefetch) * kUnit) << "prefetch " << prefetch;
    });
  }
}

TEST(FullyShardedDataParallel, AFullStateDictLoadsAtAnotherWorldSize) {
  StateDict saved;
  std::mutex mutex;
  const at::Tensor x = fsdp_batch(0, 3);
  at::Tensor want;
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(7);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    torch::optim::SGD sgd(fsdp.parameters(), 0.1);
    loss(fsdp.forward(fsdp_batch(rank, 0))).backward();
    sgd.step();
    const StateDict state = fsdp.full_state_dict();
    const at::NoGradGuard no_grad;
    const at::Tensor out = fsdp.forward(x);
    const std::lock_guard<std::mutex> lock(mutex);
    if (rank == 0) saved = state, want = out;
  });
  // The unsharded model loads it: the names are its own.
  Net plain = fsdp_net(8);
  load_state_dict(*plain, saved);
  EXPECT_TRUE(at::allclose(plain->forward(x), want));
  testing::run_gloo_ranks(3, [&](int, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(9);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    fsdp.load_full_state_dict(saved);
    const at::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(fsdp.forward(x), want));
    // A wrong shape or name is refused before anything is loaded.
    StateDict wrong = saved;
    wrong["head.weight"] = at::zeros({5, 21}, at::kDouble);
    EXPECT_THROW_MSG(fsdp.load_full_state_dict(wrong), InvalidArgumentError, "'head.weight' is [5, 21]");
    StateDict extra = saved;
    extra.insert("tail.weight", at::zeros({1}));
    EXPECT_THROW_MSG(fsdp.load_full_state_dict(extra), InvalidArgumentError, "'tail.weight' is not in the model");
    EXPECT_TRUE(at::allclose(fsdp.forward(x), want)) << "unchanged by the refused loads";
  });
}

// The optimizer's state in the unsharded model's layout: Adam's moments of every parameter
// equal those of Adam on the model, and a run at 3 ranks resumes at 2 from the full model and
// optimizer state as if it had never stopped.
TEST(FullyShardedDataParallel, AFullOptimizerStateResumesAtAnotherWorldSize) {
  Net reference = fsdp_net(0);
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(0.01));
  auto reference_steps = [&](int from, int to, int world) {
    for (int step = from; step < to; ++step) {
      reference_adam.zero_grad();
      at::Tensor total = at::zeros({}, at::kDouble);
      for (int r = 0; r < world; ++r) total = total + loss(reference->forward(fsdp_batch(r, step)));
      (total / world).backward();
      reference_adam.step();
    }
  };
  reference_steps(0, 2, 3);
  const OptimizerState want_after_two = optimizer_state_dict(reference_adam);
  const auto want_state = want_after_two.at("state").toGenericDict();
  StateDict model_state;
  OptimizerState optimizer_state(c10::AnyType::get(), c10::AnyType::get());
  std::mutex mutex;
  testing::run_gloo_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(rank);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    torch::optim::Adam adam(fsdp.parameters(), torch::optim::AdamOptions(0.01));
    for (int step = 0; step < 2; ++step) {
      adam.zero_grad();
      loss(fsdp.forward(fsdp_batch(rank, step))).backward();
      adam.step();
    }
    const OptimizerState full = fsdp.full_optimizer_state(adam);
    const auto state = full.at("state").toGenericDict();
    EXPECT_EQ(state.size(), want_state.size());
    for (const auto& item : want_state) {
      const auto got = state.at(item.key()).toGenericDict();
      for (const char* key : {"exp_avg", "exp_avg_sq"}) {
        EXPECT_TRUE(at::allclose(got.at(key).toTensor(), item.value().toGenericDict().at(key).toTensor(), 1e-10, 1e-12))
            << "parameter " << item.key().toInt() << " " << key;
      }
      EXPECT_EQ(got.at("step").toTensor().item<double>(), 2.0);
    }
    const StateDict weights = fsdp.full_state_dict();
    const std::lock_guard<std::mutex> lock(mutex);
    if (rank == 0) model_state = weights, optimizer_state = full;
  });
  reference_steps(2, 5, 2);  // the run goes on at 2 ranks
  const StateDict want = state_dict(*reference);
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(10 + rank);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    torch::optim::Adam adam(fsdp.parameters(), torch::optim::AdamOptions(0.5));  // the saved lr replaces it
    fsdp.load_full_state_dict(model_state);
    fsdp.load_full_optimizer_state(adam, optimizer_state);
    for (int step = 2; step < 5; ++step) {
      adam.zero_grad();
      loss(fsdp.forward(fsdp_batch(rank, step))).backward();
      adam.step();
    }
    expect_near(fsdp.full_state_dict(), want, 1e-10, "resumed at 2 ranks");
    // An optimizer state of another model is refused, and the optimizer left as it was.
    OptimizerState other = optimizer_state_dict(reference_adam);
    EXPECT_EQ(other.at("state").toGenericDict().erase(int64_t{0}), 1u);
    EXPECT_THROW_MSG(fsdp.load_full_optimizer_state(adam, other), InvalidArgumentError, "some parameters of unit");
  });
}

TEST(FullyShardedDataParallel, AShardedStateDictLoadsOnlyWhereItWasSaved) {
  std::map<int, StateDict> saved;
  std::mutex mutex;
  const at::Tensor x = fsdp_batch(1, 2);
  at::Tensor want;
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(3);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    torch::optim::SGD sgd(fsdp.parameters(), 0.1);
    loss(fsdp.forward(fsdp_batch(rank, 0))).backward();
    sgd.step();
    const StateDict state = fsdp.sharded_state_dict();
    const at::NoGradGuard no_grad;
    const at::Tensor out = fsdp.forward(x);
    const std::lock_guard<std::mutex> lock(mutex);
    saved[rank] = state;
    if (rank == 0) want = out;
  });
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(4);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    EXPECT_THROW_MSG(fsdp.load_sharded_state_dict(saved[1 - rank]), InvalidArgumentError,
                     "each rank loads the one it saved");
    fsdp.load_sharded_state_dict(saved[rank]);
    const at::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(fsdp.forward(x), want));
  });
  testing::run_gloo_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(4);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    EXPECT_THROW_MSG(fsdp.load_sharded_state_dict(saved[std::min(rank, 1)]), InvalidArgumentError,
                     "saved by 2 ranks and this job has 3");
    EXPECT_THROW_MSG(fsdp.load_sharded_state_dict(fsdp.full_state_dict()), InvalidArgumentError,
                     "not a sharded state dict");
  });
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(4);  // all one unit: another layout of the same parameters
    FullyShardedDataParallel fsdp(model, group);
    EXPECT_THROW_MSG(fsdp.load_sharded_state_dict(saved[rank]), InvalidArgumentError, "another model");
  });
}

TEST(FullyShardedDataParallel, NoSyncAccumulatesAndTheNextBackwardReducesTheSum) {
  Net reference = fsdp_net(0);
  for (int micro = 0; micro < 2; ++micro) {
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int r = 0; r < 2; ++r) total = total + loss(reference->forward(fsdp_batch(r, micro)));
    (total / 2).backward();
  }
  std::vector<at::Tensor> want;
  for (const at::Tensor& p : reference->parameters()) want.push_back(p.grad());
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(rank);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    {
      auto guard = fsdp.no_sync();
      loss(fsdp.forward(fsdp_batch(rank, 0))).backward();
      for (const at::Tensor& shard : fsdp.parameters()) EXPECT_FALSE(shard.grad().defined()) << "nothing reduced";
    }
    loss(fsdp.forward(fsdp_batch(rank, 1))).backward();
    // Each parameter's gradient, gathered from the shards: the full state dict of a model whose
    // "parameters" are the gradients, by swapping the shards' values for their gradients.
    {
      const at::NoGradGuard no_grad;
      for (const at::Tensor& shard : fsdp.parameters()) shard.detach().copy_(shard.grad());
    }
    const StateDict grads = fsdp.full_state_dict();
    size_t i = 0;
    for (const auto& item : grads) {
      EXPECT_TRUE(at::allclose(item.value(), want[i++], 1e-12, 1e-12)) << item.key();
    }
  });
}

TEST(FullyShardedDataParallel, ClippingTheShardsEqualsClippingTheModel) {
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    Net reference = fsdp_net(0);
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int r = 0; r < 3; ++r) total = total + loss(reference->forward(fsdp_batch(r, 0)));
    (total * 10).backward();  // large enough to clip
    const double want_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.5, norm_type);
    torch::optim::SGD reference_sgd(reference->parameters(), 1.0);
    reference_sgd.step();
    const StateDict want = state_dict(*reference);
    testing::run_gloo_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      Net model = fsdp_net(rank);
      fully_shard_each<torch::nn::LinearImpl>(*model, group);
      FullyShardedDataParallel fsdp(model, group);
      (loss(fsdp.forward(fsdp_batch(rank, 0))) * 30).backward();  // the mean over 3 ranks of 30 x: 10 x the sum
      EXPECT_NEAR(fsdp.clip_grad_norm_(0.5, norm_type), want_norm, 1e-10 * want_norm) << "norm " << norm_type;
      torch::optim::SGD sgd(fsdp.parameters(), 1.0);
      sgd.step();
      expect_near(fsdp.full_state_dict(), want, 1e-10, "norm " + std::to_string(norm_type));
    });
  }
}

TEST(FullyShardedDataParallel, AveragingBySamplesIsTheGradientOfTheGlobalBatch) {
  // Ranks with 3, 4 and 5 rows: the mean over all 12, not the mean of the ranks' means.
  Net reference = fsdp_net(0);
  torch::optim::SGD reference_sgd(reference->parameters(), 0.1);
  at::Tensor all = at::cat({fsdp_batch(0, 0), fsdp_batch(1, 0), fsdp_batch(2, 0)});
  loss(reference->forward(all)).backward();
  reference_sgd.step();
  const StateDict want = state_dict(*reference);
  testing::run_gloo_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net model = fsdp_net(rank);
    FsdpOptions options;
    options.average_by_samples = true;
    fully_shard_each<torch::nn::LinearImpl>(*model, group, options);
    FullyShardedDataParallel fsdp(model, group, options);
    torch::optim::SGD sgd(fsdp.parameters(), 0.1);
    loss(fsdp.forward(fsdp_batch(rank, 0))).backward();
    sgd.step();
    expect_near(fsdp.full_state_dict(), want, 1e-12, "rank " + std::to_string(rank));
  });
}

TEST(FullyShardedDataParallel, MixedPrecisionComputesInBfloat16AndStepsFloat32Shards) {
  constexpr int kSteps = 5;
  std::map<int, StateDict> results;  // 0: float32, 1: bfloat16 parameters
  std::mutex mutex;
  for (int mixed : {0, 1}) {
    testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      Net model = fsdp_net(0, at::kFloat);
      FsdpOptions options;
      if (mixed) options.param_dtype = at::kBFloat16;
      fully_shard_each<torch::nn::LinearImpl>(*model, group, options);
      FullyShardedDataParallel fsdp(model, group, options);
      for (const at::Tensor& shard : fsdp.parameters()) EXPECT_EQ(shard.scalar_type(), at::kFloat);
      torch::optim::SGD sgd(fsdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int step = 0; step < kSteps; ++step) {
        sgd.zero_grad();
        const at::Tensor out = fsdp.forward(fsdp_batch(rank, step, at::kFloat));
        EXPECT_EQ(out.scalar_type(), mixed ? at::kBFloat16 : at::kFloat);
        loss(out.to(at::kFloat)).backward();
        sgd.step();
      }
      const StateDict state = fsdp.full_state_dict();
      const std::lock_guard<std::mutex> lock(mutex);
      if (rank == 0) results[mixed] = state;
    });
  }
  // bfloat16 keeps 8 significant bits (relative error 2^-9 per operation): after 5 steps
  // the parameters are within 0.02 of the float32 run's; a dtype mix-up would be far off.
  for (const auto& item : results[0]) {
    EXPECT_EQ(results[1][item.key()].scalar_type(), at::kFloat) << item.key();
    EXPECT_TRUE(at::allclose(results[1][item.key()], item.value(), 0, 0.02)) << item.key();
    EXPECT_FALSE(at::equal(results[1][item.key()], item.value())) << item.key() << ": bfloat16 changed nothing?";
  }
}

// BatchNorm under mixed precision: its statistics kept in bfloat16 while training
// (buffer_dtype; the CPU's batch norm computes in one dtype), in float32 in the state dict.
TEST(FullyShardedDataParallel, MixedPrecisionKeepsBatchNormStatisticsInTheBufferDtype) {
  std::map<int, StateDict> results;
  std::mutex mutex;
  for (int mixed : {0, 1}) {
    testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      torch::nn::Sequential model;
      {
        const std::lock_guard<std::mutex> lock(testing::generator_mutex());
        torch::manual_seed(2);
        model = torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)), torch::nn::BatchNorm2d(4),
                                      torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(4 * 6 * 6, 3));
      }
      FsdpOptions options;
      if (mixed) options.param_dtype = options.buffer_dtype = at::kBFloat16;
      EXPECT_EQ((fully_shard_each<torch::nn::Conv2dImpl, torch::nn::BatchNorm2dImpl, torch::nn::LinearImpl>(
                    *model, group, options)),
                3);
      FullyShardedDataParallel fsdp(model, group, options);
      torch::optim::SGD sgd(fsdp.parameters(), 0.05);
      for (int step = 0; step < 3; ++step) {
        sgd.zero_grad();
        const at::Tensor x = at::sin(at::arange(2 * 64, at::kFloat).view({2, 1, 8, 8}) * (0.2 + rank) + step);
        loss(fsdp.forward(x).to(at::kFloat)).backward();
        sgd.step();
      }
      const StateDict state = fsdp.full_state_dict();
      const std::lock_guard<std::mutex> lock(mutex);
      if (rank == 0) results[mixed] = state;
    });
  }
  for (const auto& item : results[0]) {
    const at::Tensor& got = results[1][item.key()];
    EXPECT_EQ(got.scalar_type(), item.value().scalar_type()) << item.key() << ": back in its own dtype";
    EXPECT_TRUE(at::allclose(got.to(at::kDouble), item.value().to(at::kDouble), 0.02, 0.02)) << item.key();
  }
}

// A block whose forward checkpoints its inside: recomputed in backward within its unit.
struct CheckpointedBlockImpl : torch::nn::Module {
  explicit CheckpointedBlockImpl(bool checkpointed)
      : checkpointed(checkpointed),
        a(register_module("a", torch::nn::Linear(10, 16))),
        b(register_module("b", torch::nn::Linear(16, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto inside = [this](const at::Tensor& in) { return b->forward(at::relu(a->forward(in))); };
    return checkpointed ? checkpoint(inside, x) : inside(x);
  }
  bool checkpointed;
  torch::nn::Linear a, b;
};

TEST(FullyShardedDataParallel, ActivationCheckpointingInsideUnitsGivesTheSameTraining) {
  // 0: no checkpointing; 1: the block checkpoints its inside; 2: checkpoint_each wraps the
  // blocks, and the wrappers become the units.
  std::map<int, StateDict> results;
  std::mutex mutex;
  for (int how : {0, 1, 2}) {
    testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      torch::nn::Sequential model;
      {
        const std::lock_guard<std::mutex> lock(testing::generator_mutex());
        torch::manual_seed(5);
        model->push_back(CheckpointedBlockImpl(how == 1));
        model->push_back(CheckpointedBlockImpl(how == 1));
        model->to(at::kDouble);
      }
      if (how == 2) {
        EXPECT_EQ(checkpoint_each<CheckpointedBlockImpl>(*model), 2);
        EXPECT_EQ(fully_shard_each<CheckpointedImpl<CheckpointedBlockImpl>>(*model, group), 2);
      } else {
        EXPECT_EQ(fully_shard_each<CheckpointedBlockImpl>(*model, group), 2);
      }
      FullyShardedDataParallel fsdp(model, group);
      torch::optim::SGD sgd(fsdp.parameters(), 0.1);
      for (int step = 0; step < 3; ++step) {
        sgd.zero_grad();
        loss(fsdp.forward(fsdp_batch(rank, step))).backward();
        sgd.step();
      }
      const StateDict state = fsdp.full_state_dict();
      const std::lock_guard<std::mutex> lock(mutex);
      if (rank == 0) results[how] = state;
    });
  }
  expect_near(results[1], results[0], 1e-12, "checkpointed inside");
  expect_near(results[2], results[0], 1e-12, "checkpoint_each");
}

// d2l's ResNet-18, each Residual block a unit and the stem and head the root's: training
// equals one process (BatchNorm normalises each rank's batch on its own, as the reference
// does by running each rank's batch separately; running statistics are each rank's own).
std::unique_ptr<torch::optim::Optimizer> resnet_optimizer(std::vector<at::Tensor> params, bool adam) {
  if (adam) return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

void expect_resnet18_trains_as_one_process(int world, bool adam) {
  constexpr int kSteps = 5;
  const auto image = testing::fsdp_images;
  const auto make = testing::fsdp_resnet18;
  models::ResNet18 reference = make(0);
  auto reference_sgd = resnet_optimizer(reference->parameters(), adam);
  for (int step = 0; step < kSteps; ++step) {
    reference_sgd->zero_grad();
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int r = 0; r < world; ++r) total = total + loss(reference->forward(image(r, step)));
    (total / world).backward();
    reference_sgd->step();
  }
  testing::run_gloo_ranks(world, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    models::ResNet18 model = make(rank);
    EXPECT_EQ(fully_shard_each<models::ResidualImpl>(*model, group), 8);
    FullyShardedDataParallel fsdp(model, group);
    EXPECT_EQ(fsdp.units(), 9u);
    auto sgd = resnet_optimizer(fsdp.parameters(), adam);
    for (int step = 0; step < kSteps; ++step) {
      sgd->zero_grad();
      loss(fsdp.forward(image(rank, step))).backward();
      sgd->step();
    }
    const StateDict got = fsdp.full_state_dict();
    for (const auto& item : reference->named_parameters()) {
      EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-10, 1e-10)) << item.key();
    }
  });
}

TEST(FullyShardedDataParallel, ResNet18TrainsAsOneProcessWithSgdAtTwoRanks) {
  expect_resnet18_trains_as_one_process(2, false);
}

TEST(FullyShardedDataParallel, ResNet18TrainsAsOneProcessWithAdamAtThreeRanks) {
  expect_resnet18_trains_as_one_process(3, true);
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
    const std::lock_guard<std::mutex> lock(testing::generator_mutex());
    plain = TwoHeads();
  }
  auto [a, b] = plain->forward(x);
  (a.pow(2).sum() + b.sum()).backward();
  std::vector<at::Tensor> want;
  for (const at::Tensor& p : plain->parameters()) want.push_back(p.grad().reshape({-1}));
  testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    TwoHeads model;
    {
      const std::lock_guard<std::mutex> lock(testing::generator_mutex());
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

// A model of one's own with named members, as a PyTorch user writes it (issue 51).
struct MembersImpl : torch::nn::Module {
  MembersImpl()
      : fc1(register_module("fc1", torch::nn::Linear(10, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 16))),
        fc3(register_module("fc3", torch::nn::Linear(16, 4))),
        scale(register_parameter("scale", at::ones({4}))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(fc2(fc1(x).relu()).tanh()) * scale; }
  torch::nn::Linear fc1, fc2, fc3;
  at::Tensor scale;
};
TORCH_MODULE(Members);

Members members(uint64_t seed) {
  const std::lock_guard<std::mutex> lock(testing::generator_mutex());
  torch::manual_seed(seed);
  Members model;
  model->to(at::kDouble);
  return model;
}

TEST(FullyShardedDataParallel, UnitsOnNamedMembersTrainAsOneProcess) {
  constexpr int kSteps = 5, kWorld = 2;
  Members reference = members(0);
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(0.01));
  for (int step = 0; step < kSteps; ++step) {
    reference_adam.zero_grad();
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int r = 0; r < kWorld; ++r) total = total + loss(reference->forward(fsdp_batch(r, step)));
    (total / kWorld).backward();
    reference_adam.step();
  }
  const StateDict want = state_dict(*reference);
  for (const bool by_policy : {false, true}) {
    testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      Members model = members(rank);
      if (by_policy) {
        EXPECT_EQ(fully_shard_each<torch::nn::LinearImpl>(*model, group), 3);
      } else {
        fully_shard(model->fc1, group);  // as PyTorch's fully_shard(model.fc1); fc3 stays the root's
        fully_shard(model->fc2, group);
        EXPECT_THROW_MSG(fully_shard(model->fc2, group), InvalidArgumentError, "is an FSDP unit already");
      }
      FullyShardedDataParallel fsdp(model, group);
      EXPECT_EQ(fsdp.units(), by_policy ? 4u : 3u);
      EXPECT_EQ(model->named_parameters().keys(), reference->named_parameters().keys());
      EXPECT_THROW_MSG(FullyShardedDataParallel(model, group), InvalidArgumentError, "in one FullyShardedDataParallel");
      torch::optim::Adam adam(fsdp.parameters(), torch::optim::AdamOptions(0.01));
      for (int step = 0; step < kSteps; ++step) {
        adam.zero_grad();
        loss(fsdp.forward(fsdp_batch(rank, step))).backward();
        EXPECT_FALSE(fsdp.gathered()) << "after backward";
        adam.step();
      }
      expect_near(fsdp.full_state_dict(), want, 1e-10, "rank " + std::to_string(rank));
      // A checkpoint goes through FSDP; the module's own way is refused, not a crash.
      EXPECT_THROW_MSG(train::make_checkpoint(*model, adam, kSteps), InvalidArgumentError,
                       "scale is sharded by FullyShardedDataParallel");
      const train::Checkpoint checkpoint = train::make_checkpoint(fsdp, adam, kSteps);
      expect_near(checkpoint.model, want, 1e-10, "checkpoint");
      Members resumed = members(rank + 7);
      if (!by_policy) fully_shard(resumed->fc1, group), fully_shard(resumed->fc2, group);
      if (by_policy) fully_shard_each<torch::nn::LinearImpl>(*resumed, group);
      FullyShardedDataParallel again(resumed, group);
      torch::optim::Adam again_adam(again.parameters(), torch::optim::AdamOptions(0.01));
      train::restore_checkpoint(checkpoint, again, again_adam, /*restore_rng=*/false);
      expect_near(again.full_state_dict(), want, 0, "restored");
      // Adam's moments came back too: one more step of each run ends in the same place.
      for (auto [wrapper, opt] : {std::pair{&fsdp, &adam}, std::pair{&again, &again_adam}}) {
        opt->zero_grad();
        loss(wrapper->forward(fsdp_batch(rank, kSteps))).backward();
        opt->step();
      }
      expect_near(again.full_state_dict(), fsdp.full_state_dict(), 0, "a step after restoring");
    });
  }
}

TEST(FullyShardedDataParallel, ShardingAnOuterModuleBeforeAnInnerOneIsRefused) {
  testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    Members model = members(0);
    fully_shard(model.ptr(), group);  // the whole model first: fc1 is inside it
    EXPECT_THROW_MSG(fully_shard(model->fc1, group), InvalidArgumentError, "inner modules before the ones around them");
  });
}

TEST(FullyShardedDataParallel, RefusesUnitsOfMixedDtypesAndUnitsWithoutARoot) {
  testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
    model[1]->to(at::kDouble);
    EXPECT_THROW_MSG(FullyShardedDataParallel(model, group), InvalidArgumentError, "mix Float");
    torch::nn::Sequential units(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
    fully_shard_each<torch::nn::LinearImpl>(*units, group);
    EXPECT_THROW_MSG(units->forward(at::ones({1, 2})), InvalidArgumentError, "ran without a root");
  });
}

}  // namespace
}  // namespace datapar
