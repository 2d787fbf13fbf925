// Local SGD and DiLoCo (datapar/diloco/diloco.h, issue 48) with ranks as threads (Gloo over
// loopback): local SGD averaging after every step is DDP's training; DiLoCo's rounds equal a
// reference worked out here by hand (each rank's inner steps, the average, SGD with Nesterov
// momentum on the pseudo-gradient); a DiLoCo made anew from another's state continues its
// run to the bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/diloco/diloco.h"
#include "datapar/state_dict.h"
#include "diloco/outer_exchange.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"

namespace datapar {
namespace diloco_test {

constexpr int kWorld = 2;

std::mutex g_generator;  // the default generator is not thread-safe

torch::nn::Sequential make_model() {
  const std::lock_guard<std::mutex> lock(g_generator);
  torch::manual_seed(11);
  torch::nn::Sequential m(torch::nn::Linear(6, 5), torch::nn::Linear(5, 3));
  m->to(at::kDouble);
  return m;
}

at::Tensor batch(int rank, int step) {
  at::Generator g = at::detail::createCPUGenerator(1000 * rank + step + 1);
  return at::randn({8, 6}, g, at::kDouble);
}

// One inner step of `model` on rank `rank`'s batch of `step`.
void inner_step(torch::nn::Sequential& model, torch::optim::SGD& sgd, int rank, int step) {
  sgd.zero_grad();
  model->forward(batch(rank, step)).pow(2).mean().backward();
  sgd.step();
}

std::vector<at::Tensor> values(torch::nn::Sequential& model) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_equal(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double tolerance,
                  const std::string& where) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(at::allclose(got[i], want[i], tolerance, tolerance))
        << where << ", parameter " << i << " differs by " << (got[i] - want[i]).abs().max().item<double>();
  }
}

TEST(LocalSgd, AveragingAfterEveryStepIsDdp) {
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential a = make_model(), b = make_model();
    DistributedDataParallel ddp(a, group);
    torch::optim::SGD ddp_sgd(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    DiLoCoOptions every_step;
    every_step.sync_every = 1;
    every_step.outer = "replace";
    torch::optim::SGD local_sgd(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    DiLoCo local(b->parameters(), group, every_step);
    for (int step = 0; step < 5; ++step) {
      ddp_sgd.zero_grad();
      ddp.forward(batch(rank, step)).pow(2).mean().backward();
      ddp_sgd.step();
      inner_step(b, local_sgd, rank, step);
      EXPECT_TRUE(local.step());
      expect_equal(values(b), values(a), 1e-12, "rank " + std::to_string(rank) + " step " + std::to_string(step));
    }
  });
}

// Two rounds of 3 inner steps (SGD, lr 0.1) and the outer step (lr 0.7, momentum 0.9), by
// hand: for each rank, its inner steps from the round's start; the average; the
// pseudo-gradient g = start - average; buf = 0.9 buf + g; start -= 0.7 (g + 0.9 buf).
TEST(DiLoCo, RoundsEqualTheOuterStepWorkedOutByHand) {
  constexpr int kH = 3, kRounds = 2;
  std::vector<at::Tensor> start = values(*std::make_unique<torch::nn::Sequential>(make_model()));
  std::vector<at::Tensor> buf;
  for (const at::Tensor& s : start) buf.push_back(at::zeros_like(s));
  std::vector<torch::nn::Sequential> ranks = {make_model(), make_model()};
  std::vector<std::unique_ptr<torch::optim::SGD>> inner;
  for (auto& m : ranks) inner.push_back(std::make_unique<torch::optim::SGD>(m->parameters(), 0.1));
  std::vector<std::vector<at::Tensor>> want;  // the parameters after each round
  for (int round = 0; round < kRounds; ++round) {
    std::vector<at::Tensor> average;
    for (int r = 0; r < kWorld; ++r) {
      {
        const torch::NoGradGuard no_grad;
        const auto params = ranks[r]->parameters();
        for (size_t i = 0; i < params.size(); ++i) params[i].copy_(start[i]);
      }
      for (int s = 0; s < kH; ++s) inner_step(ranks[r], *inner[r], r, round * kH + s);
      const std::vector<at::Tensor> mine = values(ranks[r]);
      for (size_t i = 0; i < mine.size(); ++i) {
        if (average.size() <= i) average.push_back(at::zeros_like(mine[i]));
        average[i] += mine[i] / kWorld;
      }
    }
    for (size_t i = 0; i < start.size(); ++i) {
      const at::Tensor g = start[i] - average[i];
      buf[i] = 0.9 * buf[i] + g;
      start[i] = start[i] - 0.7 * (g + 0.9 * buf[i]);
    }
    want.push_back(start);
  }
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = make_model();
    torch::optim::SGD sgd(model->parameters(), 0.1);
    DiLoCoOptions options;
    options.sync_every = kH;
    DiLoCo diloco(model->parameters(), group, options);
    for (int step = 0; step < kH * kRounds; ++step) {
      inner_step(model, sgd, rank, step);
      EXPECT_EQ(diloco.step(), (step + 1) % kH == 0);
      if ((step + 1) % kH == 0) {
        expect_equal(values(model), want[step / kH], 1e-12, "rank " + std::to_string(rank) + " round " +
                                                                std::to_string(step / kH));
      }
    }
    EXPECT_EQ(diloco.rounds(), kRounds);
  });
}

// The parameters end to end, and back.
at::Tensor flat_values(torch::nn::Sequential& model) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& p : model->parameters()) parts.push_back(p.detach().reshape({-1}));
  return at::cat(parts);
}

void set_flat(torch::nn::Sequential& model, const at::Tensor& flat) {
  const torch::NoGradGuard no_grad;
  int64_t at = 0;
  for (at::Tensor p : model->parameters()) {
    p.copy_(flat.narrow(0, at, p.numel()).view(p.sizes()));
    at += p.numel();
  }
}

// Streaming DiLoCo, by hand: 53 parameters end to end in 2 fragments, [0, 26) and [26, 53)
// (across the first Linear's bias and the second's weight), rounds of 4 steps: fragment 0
// syncs at steps 2, 6, 10, fragment 1 at 4, 8, 12, each with the outer step on its range
// alone (its own outer parameters and momentum), the rest of each rank's model its own.
TEST(StreamingDiLoCo, EachFragmentSyncsAtItsStepWithTheOuterStepWorkedOutByHand) {
  constexpr int kH = 4, kK = 2, kSteps = 12;
  std::vector<torch::nn::Sequential> ranks = {make_model(), make_model()};
  const int64_t n = flat_values(ranks[0]).numel();
  ASSERT_EQ(n, 53);
  at::Tensor start = flat_values(ranks[0]), buf = at::zeros_like(start);
  std::vector<std::unique_ptr<torch::optim::SGD>> inner;
  for (auto& m : ranks) inner.push_back(std::make_unique<torch::optim::SGD>(m->parameters(), 0.1));
  std::vector<std::vector<at::Tensor>> want(kWorld);  // each rank's parameters after each step
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kWorld; ++r) inner_step(ranks[r], *inner[r], r, step);
    for (int k = 0; k < kK; ++k) {
      if ((step + 1) % kH != kH * (k + 1) / kK % kH) continue;
      const int64_t begin = n * k / kK, length = n * (k + 1) / kK - begin;
      at::Tensor average = at::zeros({length}, at::kDouble);
      for (int r = 0; r < kWorld; ++r) average += flat_values(ranks[r]).narrow(0, begin, length) / kWorld;
      const at::Tensor g = start.narrow(0, begin, length) - average;
      buf.narrow(0, begin, length).mul_(0.9).add_(g);
      start.narrow(0, begin, length).sub_(0.7 * (g + 0.9 * buf.narrow(0, begin, length)));
      for (int r = 0; r < kWorld; ++r) {
        at::Tensor mine = flat_values(ranks[r]);
        mine.narrow(0, begin, length).copy_(start.narrow(0, begin, length));
        set_flat(ranks[r], mine);
      }
    }
    for (int r = 0; r < kWorld; ++r) want[r].push_back(flat_values(ranks[r]));
  }
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = make_model();
    torch::optim::SGD sgd(model->parameters(), 0.1);
    DiLoCoOptions options;
    options.sync_every = kH;
    options.fragments = kK;
    DiLoCo diloco(model->parameters(), group, options);
    for (int step = 0; step < kSteps; ++step) {
      inner_step(model, sgd, rank, step);
      EXPECT_EQ(diloco.step(), (step + 1) % 2 == 0) << "a fragment every other step";
      EXPECT_TRUE(at::allclose(flat_values(model), want[rank][step], 1e-12, 1e-12))
          << "rank " << rank << " step " << step;
    }
    EXPECT_EQ(diloco.rounds(), kSteps / kH);
  });
}

// The quantised exchange: bf16, the mean of the bf16 values summed in float32 and sent in
// bf16, to the bit; int8 within its blocks' steps; the same on every rank either way.
TEST(DiLoCo, TheQuantisedOuterExchangeIsTheMeanInItsDtypeAndTheSameOnEveryRank) {
  constexpr int kRanks = 3;
  constexpr int64_t kNumel = 1000;  // not a whole number of 3 x 256 blocks: padded
  const auto values = [](int rank) {
    at::Generator g = at::detail::createCPUGenerator(77 + rank);
    return at::randn({kNumel}, g, at::kFloat) * (rank + 1);
  };
  at::Tensor bf16_sum = at::zeros({kNumel}), exact = at::zeros({kNumel});
  for (int r = 0; r < kRanks; ++r) {
    bf16_sum += values(r).to(at::kBFloat16).to(at::kFloat);
    exact += values(r);
  }
  const at::Tensor want_bf16 = (bf16_sum / kRanks).to(at::kBFloat16).to(at::kFloat);
  exact /= kRanks;
  std::vector<at::Tensor> int8_results(kRanks);
  testing::run_gloo_ranks(kRanks, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    EXPECT_TRUE(at::equal(detail::outer_average(*group, values(rank), "bf16"), want_bf16)) << "rank " << rank;
    EXPECT_TRUE(at::allclose(detail::outer_average(*group, values(rank), "float32"), exact, 1e-6, 1e-6));
    int8_results[rank] = detail::outer_average(*group, values(rank), "int8");
  });
  // Each rank's value off by at most half its block's step (its largest / 127 / 2), the mean
  // once more by half of its own: within 3 / 127 of the largest magnitude here (3 x 4 sigma).
  const double bound = 3 * 4.5 / 127;
  EXPECT_LT((int8_results[0] - exact).abs().max().item<double>(), bound);
  for (int r = 1; r < kRanks; ++r) EXPECT_TRUE(at::equal(int8_results[r], int8_results[0])) << "rank " << r;
  EXPECT_EQ(detail::outer_average_bytes(kNumel, 2, "float32"), 4000);
  EXPECT_EQ(detail::outer_average_bytes(kNumel, 2, "int8"), 1024 + 4 * 4);
}

// The halves of sync() that fault tolerance takes apart (ft::FaultTolerantDiLoCo): three
// ranks train 3 inner steps, rank 2's weight 0 (it joined during the round); the average is
// ranks 0 and 1's alone, taking it changes nothing, and the outer step with it is the one
// worked out by hand. Weights that sum to 0 are refused on every rank.
TEST(DiLoCo, AWeightedAverageCountsOnlyTheRanksThatTrainedAndChangesNothing) {
  constexpr int kRanks = 3, kH = 3;
  const auto trained = [](int rank) {
    torch::nn::Sequential model = make_model();
    torch::optim::SGD sgd(model->parameters(), 0.1);
    for (int s = 0; s < kH; ++s) inner_step(model, sgd, rank, s);
    return flat_values(model);
  };
  torch::nn::Sequential untrained = make_model();
  const at::Tensor start = flat_values(untrained);
  const at::Tensor average = (trained(0) + trained(1)) / 2;
  const at::Tensor g = start - average;  // the first round's momentum is g itself
  const at::Tensor want = start - 0.7 * (g + 0.9 * g);
  testing::run_gloo_ranks(kRanks, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = make_model();
    torch::optim::SGD sgd(model->parameters(), 0.1);
    DiLoCoOptions options;
    options.sync_every = kH;
    DiLoCo diloco(model->parameters(), group, options);
    if (rank < 2) {
      for (int s = 0; s < kH; ++s) inner_step(model, sgd, rank, s);
    }
    const at::Tensor before = flat_values(model);
    const DiLoCo::Average got = diloco.average_parameters(*group, rank < 2 ? 1.0 : 0.0);
    EXPECT_EQ(got.weights, 2);
    EXPECT_TRUE(at::allclose(got.parameters, average, 1e-12, 1e-12)) << "rank " << rank;
    EXPECT_TRUE(at::equal(flat_values(model), before)) << "the average changed the parameters";
    EXPECT_EQ(diloco.state_dict()["momentum.0"].abs().sum().item<double>(), 0) << "or the momentum";
    EXPECT_EQ(diloco.rounds(), 0);
    diloco.outer_step(got);
    EXPECT_EQ(diloco.rounds(), 1);
    EXPECT_TRUE(at::allclose(flat_values(model), want, 1e-12, 1e-12)) << "rank " << rank;
    EXPECT_THROW_MSG(diloco.average_parameters(*group, 0), InvalidArgumentError, "every rank's weight is 0");
  });
}

// The same in bf16 (the weighted pseudo-gradients through the quantised exchange): rank 1's
// weight 0, the average ranks 0 and 2's within bf16's rounding, the same on every rank.
TEST(DiLoCo, AWeightedAverageInBf16CountsOnlyTheRanksThatTrained) {
  constexpr int kRanks = 3, kH = 2;
  const auto make_float = [] {
    torch::nn::Sequential model = make_model();
    model->to(at::kFloat);
    return model;
  };
  const auto train = [](torch::nn::Sequential& model, int rank) {
    torch::optim::SGD sgd(model->parameters(), 0.1);
    for (int s = 0; s < kH; ++s) {
      sgd.zero_grad();
      model->forward(batch(rank, s).to(at::kFloat)).pow(2).mean().backward();
      sgd.step();
    }
  };
  torch::nn::Sequential a = make_float(), b = make_float();
  const at::Tensor start = flat_values(a);
  train(a, 0);
  train(b, 2);
  const at::Tensor average = (flat_values(a) + flat_values(b)) / 2;
  std::vector<at::Tensor> results(kRanks);
  testing::run_gloo_ranks(kRanks, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = make_float();
    DiLoCoOptions options;
    options.sync_every = kH;
    options.outer_dtype = "bf16";
    DiLoCo diloco(model->parameters(), group, options);
    if (rank != 1) train(model, rank);
    results[rank] = diloco.average_parameters(*group, rank != 1 ? 1.0 : 0.0).parameters;
  });
  // Each pseudo-gradient off by bf16's half step (2^-9 relative), the mean again by as much.
  const double bound = 3 * std::pow(2.0, -9) * (start - average).abs().max().item<double>() + 1e-7;
  EXPECT_LT((results[0] - average).abs().max().item<double>(), bound);
  for (int r = 1; r < kRanks; ++r) EXPECT_TRUE(at::equal(results[r], results[0])) << "rank " << r;
}

TEST(DiLoCo, AnotherMadeFromItsStateContinuesTheRun) {
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    DiLoCoOptions options;
    options.sync_every = 2;
    torch::nn::Sequential straight = make_model(), resumed = make_model();
    torch::optim::SGD straight_sgd(straight->parameters(), 0.1), resumed_sgd(resumed->parameters(), 0.1);
    DiLoCo a(straight->parameters(), group, options);
    auto b = std::make_unique<DiLoCo>(resumed->parameters(), group, options);
    for (int step = 0; step < 9; ++step) {
      if (step == 5) {  // in the middle of a round
        const StateDict state = b->state_dict();
        b = std::make_unique<DiLoCo>(resumed->parameters(), group, options, state);
      }
      inner_step(straight, straight_sgd, rank, step);
      a.step();
      inner_step(resumed, resumed_sgd, rank, step);
      b->step();
    }
    expect_equal(values(resumed), values(straight), 0, "rank " + std::to_string(rank));
    EXPECT_THROW_MSG(DiLoCo(resumed->parameters(), group, options, StateDict()), InvalidArgumentError,
                     "no \"inner_steps\" in the state");
  });
}

TEST(DiLoCo, RefusesWhatItCannotDo) {
  testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = make_model();
    DiLoCoOptions o;
    o.sync_every = 0;
    EXPECT_THROW_MSG(DiLoCo(model->parameters(), group, o), InvalidArgumentError, "sync_every is 0");
    o.sync_every = 5;
    o.outer = "adam";
    EXPECT_THROW_MSG(DiLoCo(model->parameters(), group, o), InvalidArgumentError, "\"adam\" is not one of nesterov");
    o.outer = "nesterov";
    o.fragments = 6;
    EXPECT_THROW_MSG(DiLoCo(model->parameters(), group, o), InvalidArgumentError, "use 1 to sync_every fragments");
    o.fragments = 2;
    o.outer_dtype = "fp8";
    EXPECT_THROW_MSG(DiLoCo(model->parameters(), group, o), InvalidArgumentError, "\"fp8\" is not one of float32");
    o.outer_dtype = "int8";  // the model is float64
    EXPECT_THROW_MSG(DiLoCo(model->parameters(), group, o), InvalidArgumentError, "takes float32 parameters");
  });
}

}  // namespace diloco_test
}  // namespace datapar
