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

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/diloco/diloco.h"
#include "datapar/state_dict.h"
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
  });
}

}  // namespace diloco_test
}  // namespace datapar
