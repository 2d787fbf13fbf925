// Hybrid sharding (HSDP, FsdpOptions::replicate_group) with its ranks as threads of one
// process (Gloo over loopback): 2 "machines" of 2 ranks, each rank sharding over its
// machine and replicating across the other; training equals one process training on every
// rank's batch (as DDP's does), with and without resharding after forward, averaged by
// samples too, an MLP and d2l's ResNet-18; hybrid_groups()'s layout; a root and units that
// disagree are refused; a DCP checkpoint written once, by the first replica, loads into a
// whole model.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "datapar/dcp/fsdp_state.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/fsdp/hybrid_groups.h"
#include "datapar/models/resnet18.h"
#include "datapar/state_dict.h"
#include "testing/expect_throw.h"
#include "testing/fsdp_net.h"
#include "testing/hybrid_ranks.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace hybrid_sharding_test {

using Net = testing::FsdpNet;
using testing::fsdp_batch;
using testing::fsdp_net;

at::Tensor loss(const at::Tensor& out) { return out.pow(2).mean(); }

void expect_near(const StateDict& got, const StateDict& want, double tolerance, const std::string& where) {
  ASSERT_EQ(got.keys(), want.keys()) << where;
  for (const auto& item : want) {
    EXPECT_TRUE(at::allclose(got[item.key()], item.value(), tolerance, tolerance)) << where << ": " << item.key();
  }
}

using testing::run_hybrid_ranks;

// 5 steps of SGD with momentum at 2 x 2, against one process on the 4 ranks' batches.
void expect_two_by_two_trains_as_one_process(FsdpOptions options) {
  constexpr int kWorld = 4, kSteps = 5;
  Net reference = fsdp_net(0);
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    reference_sgd.zero_grad();
    if (options.average_by_samples) {  // the mean over every row of the job
      std::vector<at::Tensor> rows;
      for (int r = 0; r < kWorld; ++r) rows.push_back(fsdp_batch(r, step));
      loss(reference->forward(at::cat(rows))).backward();
    } else {  // the mean over ranks of each rank's mean
      at::Tensor total = at::zeros({}, at::kDouble);
      for (int r = 0; r < kWorld; ++r) total = total + loss(reference->forward(fsdp_batch(r, step)));
      (total / kWorld).backward();
    }
    reference_sgd.step();
  }
  const StateDict want = state_dict(*reference);

  run_hybrid_ranks(kWorld, /*shard_size=*/2, [&](int rank, const HybridGroups& groups) {
    EXPECT_EQ(groups.shard->size(), 2);
    EXPECT_EQ(groups.shard->rank(), rank % 2) << "machines of consecutive ranks";
    EXPECT_EQ(groups.replicate->size(), 2);
    EXPECT_EQ(groups.replicate->rank(), rank / 2);
    Net model = fsdp_net(rank);  // different: every rank starts from rank 0's
    FsdpOptions mine = options;
    mine.replicate_group = groups.replicate;
    EXPECT_EQ(fully_shard_each<torch::nn::LinearImpl>(*model, groups.shard, mine), 3);  // the head in place
    FullyShardedDataParallel fsdp(model, groups.shard, mine);
    EXPECT_EQ(fsdp.shard_numel(), 110 + 210 + 53) << "half of each unit: sharded over the machine alone";
    torch::optim::SGD sgd(fsdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      sgd.zero_grad();
      loss(fsdp.forward(fsdp_batch(rank, step))).backward();
      EXPECT_FALSE(fsdp.gathered()) << "after backward";
      sgd.step();
    }
    expect_near(fsdp.full_state_dict(), want, 1e-10, "rank " + std::to_string(rank));
  });
}

TEST(HybridSharding, TwoMachinesOfTwoRanksTrainAsOneProcess) { expect_two_by_two_trains_as_one_process({}); }

TEST(HybridSharding, KeepingTheParametersAfterForwardTrainsTheSame) {
  FsdpOptions options;
  options.reshard_after_forward = false;
  options.prefetch = 0;
  expect_two_by_two_trains_as_one_process(options);
}

// FSDP over all four ranks, resharded after forward to each machine's two
// (FsdpOptions::reshard_after_forward_group, PyTorch's reshard_after_forward=2): backward
// gathers each unit within its machine from the halves kept after forward; the training is
// FSDP's to the bit, and one process's.
TEST(HybridSharding, ReshardingAfterForwardToAMachineTrainsAsFsdpOverTheJob) {
  constexpr int kWorld = 4, kSteps = 4;
  std::mutex mutex;
  std::vector<StateDict> results(2);  // resharded to the whole group, to the machine
  for (const bool to_machine : {false, true}) {
    run_hybrid_ranks(kWorld, /*shard_size=*/2,
                     [&](int rank, const HybridGroups& groups, const std::shared_ptr<ProcessGroup>& whole) {
                       FsdpOptions options;
                       if (to_machine) options.reshard_after_forward_group = groups.shard;
                       Net model = fsdp_net(rank);
                       fully_shard_each<torch::nn::LinearImpl>(*model, whole, options);
                       FullyShardedDataParallel fsdp(model, whole, options);
                       torch::optim::SGD sgd(fsdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
                       for (int step = 0; step < kSteps; ++step) {
                         sgd.zero_grad();
                         loss(fsdp.forward(fsdp_batch(rank, step))).backward();
                         sgd.step();
                       }
                       const StateDict full = fsdp.full_state_dict();
                       if (rank != 0) return;
                       const std::lock_guard<std::mutex> lock(mutex);
                       results[to_machine ? 1 : 0] = full;
                     });
  }
  ASSERT_FALSE(results[0].is_empty());
  expect_near(results[1], results[0], 0, "resharded to the machine");
  run_hybrid_ranks(2, /*shard_size=*/2, [&](int rank, const HybridGroups& groups) {
    FsdpOptions options;
    options.reshard_after_forward_group = groups.shard;  // not smaller than the group
    Net model = fsdp_net(rank);
    EXPECT_THROW_MSG(fully_shard_each<torch::nn::LinearImpl>(*model, groups.shard, options), InvalidArgumentError,
                     "give a smaller group whose size divides the unit's");
  });
}

TEST(HybridSharding, AveragingBySamplesIsTheGradientOfTheJobsRows) {
  FsdpOptions options;
  options.average_by_samples = true;  // ranks of 3, 4, 5 and 6 rows on two machines
  expect_two_by_two_trains_as_one_process(options);
}

TEST(HybridSharding, ResNet18AtTwoByTwoTrainsAsOneProcess) {
  // d2l's ResNet-18 (its 8 residual blocks units, the stem and head the root's), float64,
  // 3 steps of SGD with momentum: BatchNorm normalises each rank's batch on its own, as the
  // reference does by running each rank's batch separately.
  constexpr int kWorld = 4, kSteps = 3;
  const auto image = testing::fsdp_images;
  const auto make = testing::fsdp_resnet18;
  models::ResNet18 reference = make(0);
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    reference_sgd.zero_grad();
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int r = 0; r < kWorld; ++r) total = total + loss(reference->forward(image(r, step)));
    (total / kWorld).backward();
    reference_sgd.step();
  }
  run_hybrid_ranks(kWorld, /*shard_size=*/2, [&](int rank, const HybridGroups& groups) {
    models::ResNet18 model = make(rank);
    FsdpOptions options;
    options.replicate_group = groups.replicate;
    EXPECT_EQ(fully_shard_each<models::ResidualImpl>(*model, groups.shard, options), 8);
    FullyShardedDataParallel fsdp(model, groups.shard, options);
    torch::optim::SGD sgd(fsdp.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      sgd.zero_grad();
      loss(fsdp.forward(image(rank, step))).backward();
      sgd.step();
    }
    const StateDict got = fsdp.full_state_dict();
    for (const auto& item : reference->named_parameters()) {
      EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-10, 1e-10)) << "rank " << rank << ": " << item.key();
    }
  });
}

TEST(HybridSharding, OneRankPerMachineIsDataParallelOverTheMachines) {
  // Shards of the whole model (groups of one): the gradient all-reduced across the three.
  Net reference = fsdp_net(0);
  torch::optim::SGD reference_sgd(reference->parameters(), 0.1);
  at::Tensor total = at::zeros({}, at::kDouble);
  for (int r = 0; r < 3; ++r) total = total + loss(reference->forward(fsdp_batch(r, 0)));
  (total / 3).backward();
  reference_sgd.step();
  const StateDict want = state_dict(*reference);
  run_hybrid_ranks(3, /*shard_size=*/1, [&](int rank, const HybridGroups& groups) {
    FsdpOptions options;
    options.replicate_group = groups.replicate;
    Net model = fsdp_net(rank);
    FullyShardedDataParallel fsdp(model, groups.shard, options);
    EXPECT_EQ(fsdp.shard_numel(), 745);
    torch::optim::SGD sgd(fsdp.parameters(), 0.1);
    loss(fsdp.forward(fsdp_batch(rank, 0))).backward();
    sgd.step();
    expect_near(fsdp.full_state_dict(), want, 1e-12, "rank " + std::to_string(rank));
  });
}

TEST(HybridSharding, ADcpCheckpointIsWrittenByTheFirstReplicaAndLoadsWhole) {
  const testing::TempDir dir("hsdp_dcp");
  const std::string ck = dir.path() + "/ck";
  std::mutex mutex;
  StateDict trained;  // rank 0's full state dict after the step
  run_hybrid_ranks(4, /*shard_size=*/2, [&](int rank, const HybridGroups& groups) {
    FsdpOptions options;
    options.replicate_group = groups.replicate;
    Net model = fsdp_net(rank);
    fully_shard_each<torch::nn::LinearImpl>(*model, groups.shard, options);
    FullyShardedDataParallel fsdp(model, groups.shard, options);
    torch::optim::SGD sgd(fsdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    loss(fsdp.forward(fsdp_batch(rank, 0))).backward();
    sgd.step();
    dcp::State state;
    dcp::add_fsdp(state, "model", fsdp);
    dcp::add_fsdp_optimizer(state, "optim", fsdp, sgd);
    dcp::save(state, ck, groups);
    EXPECT_TRUE(dcp::is_checkpoint(ck)) << "complete when save returns, on every rank";
    const StateDict full = fsdp.full_state_dict();
    if (rank == 0) {
      const std::lock_guard<std::mutex> lock(mutex);
      trained = full;
    }
  });
  int files = 0;
  for (const char* name : {"/__0_0.distcp", "/__1_0.distcp", "/__2_0.distcp", "/__3_0.distcp"}) {
    files += std::ifstream(ck + name).good() ? 1 : 0;
  }
  EXPECT_EQ(files, 2) << "one file per rank of one shard group";
  Net whole = fsdp_net(7);
  torch::optim::SGD sgd(whole->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  dcp::State state;
  dcp::add_module(state, "model", *whole);
  dcp::add_optimizer(state, "optim", sgd, *whole);
  dcp::load(state, ck);
  dcp::apply_optimizer(state, "optim", sgd, *whole);
  expect_near(state_dict(*whole), trained, 0, "the whole model");
}

TEST(HybridSharding, RefusesAShardSizeThatDoesNotDivideTheJob) {
  int made = 0;
  EXPECT_THROW_MSG(hybrid_groups(0, 4, 3, [&](const std::vector<int>&) {
    ++made;
    return std::shared_ptr<ProcessGroup>();
  }),
                               InvalidArgumentError, "does not divide the job's 4 ranks");
  EXPECT_EQ(made, 0) << "refused before any group is made";
}

TEST(HybridSharding, RefusesUnitsWhoseReplicasAreNotTheRoots) {
  run_hybrid_ranks(2, /*shard_size=*/1, [&](int rank, const HybridGroups& groups) {
    Net model = fsdp_net(rank);
    fully_shard_each<torch::nn::LinearImpl>(*model, groups.shard, FsdpOptions{});  // no replicas
    FsdpOptions hybrid;
    hybrid.replicate_group = groups.replicate;
    EXPECT_THROW_MSG(FullyShardedDataParallel(model, groups.shard, hybrid), InvalidArgumentError,
                                 "another FsdpOptions::replicate_group than the root's");
    FsdpOptions itself;
    itself.replicate_group = groups.shard;
    EXPECT_THROW_MSG(FullyShardedDataParallel(model, groups.shard, itself), InvalidArgumentError,
                                 "is the group it shards over");
  });
}

}  // namespace hybrid_sharding_test
}  // namespace datapar
