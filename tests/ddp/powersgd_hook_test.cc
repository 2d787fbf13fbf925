// PowerSGD (datapar/ddp/powersgd_hook.h, issue 48) on DDP with its ranks as threads (Gloo over
// loopback): at full rank it is the plain all-reduce (per layer and batched), a gradient
// of rank r comes through rank-r compression whole, it sends (n + m) r values per matrix,
// and a run resumed from its state continues as the uninterrupted one, to the bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/powersgd_hook.h"
#include "datapar/state_dict.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"

namespace datapar {
namespace powersgd_hook_test {

constexpr int kWorld = 2;

// The default generator is not thread-safe, and making a module draws from it.
std::mutex g_generator;

torch::nn::Sequential make_model() {
  const std::lock_guard<std::mutex> lock(g_generator);
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(24, 16), torch::nn::Linear(16, 8), torch::nn::Linear(8, 4));
}

// Rank `rank`'s batch of step `step` (`width` features); `same`: every rank's is rank 0's.
// 32 rows: each layer's gradient has full rank.
at::Tensor batch(int rank, int step, bool same = false, int64_t width = 24) {
  at::Generator g = at::detail::createCPUGenerator(100 * step + (same ? 0 : rank) + 1);
  return at::randn({32, width}, g);
}

// `steps` steps of SGD with momentum over DDP with `hook` (null: the plain all-reduce) on
// rank `rank`; the parameters after each step.
std::vector<StateDict> train(int rank, const std::shared_ptr<ProcessGroup>& group, const std::shared_ptr<CommHook>& hook,
                             int steps, torch::nn::Sequential model = make_model()) {
  const int64_t width = model->parameters().front().size(1);
  const at::ScalarType dtype = model->parameters().front().scalar_type();
  DdpOptions options;
  options.bucket_cap_mb = 0.001;  // about 250 floats: several buckets
  options.first_bucket_cap_mb = 0.001;
  DistributedDataParallel ddp(model, group, options);
  if (hook) ddp.register_comm_hook(hook);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::vector<StateDict> out;
  for (int step = 0; step < steps; ++step) {
    sgd.zero_grad();
    ddp.forward(batch(rank, step, false, width).to(dtype)).pow(2).mean().backward();
    sgd.step();
    StateDict now;  // copies: a state dict holds the live parameters
    for (const auto& item : state_dict(*model)) now.insert(item.key(), item.value().clone());
    out.push_back(now);
  }
  return out;
}

void expect_close(const StateDict& got, const StateDict& want, double tolerance, const std::string& where) {
  for (const auto& item : want) {
    EXPECT_TRUE(at::allclose(got[item.key()], item.value(), tolerance, tolerance))
        << where << ": " << item.key() << " differs by " << (got[item.key()] - item.value()).abs().max().item<double>();
  }
}

PowerSgdOptions full_rank(bool batched) {
  PowerSgdOptions o;
  o.matrix_approximation_rank = 64;  // at least every matrix's smaller side
  o.min_compression_rate = 0;        // compress even when it does not pay
  o.start_iter = 2;
  o.batched = batched;
  return o;
}

// P spans the whole column space: P P^T M = M, and the error stays at round-off (float64,
// one layer, so that its gradient has full rank; batched: 16 x 16, its bucket a square).
TEST(PowerSgd, AtFullRankItIsThePlainAllReduce) {
  for (const bool batched : {false, true}) {
    const auto model = [&] {
      const std::lock_guard<std::mutex> lock(g_generator);
      torch::manual_seed(3);
      // One layer: a layer under others gets a gradient of no more rank than theirs.
      torch::nn::Sequential m = batched ? torch::nn::Sequential(torch::nn::Linear(
                                              torch::nn::LinearOptions(16, 16).bias(false)))
                                        : torch::nn::Sequential(torch::nn::Linear(24, 16));
      m->to(at::kDouble);
      return m;
    };
    testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      const std::vector<StateDict> plain = train(rank, group, nullptr, 5, model());
      const auto hook = powersgd_hook(full_rank(batched));
      const std::vector<StateDict> compressed = train(rank, group, hook, 5, model());
      EXPECT_EQ(hook->iterations(), 5);
      EXPECT_GT(hook->numel_before(), 0) << "it compressed";
      for (int step = 0; step < 5; ++step) {
        expect_close(compressed[step], plain[step], 1e-9, (batched ? "batched, step " : "step ") + std::to_string(step));
      }
    });
  }
}

// Every rank trains on the same rows of one sample: each weight's gradient is an outer
// product, rank 1, and rank-1 compression gives it whole.
TEST(PowerSgd, ARankOneGradientComesThroughRankOneCompressionWhole) {
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential one_layer;
    {
      const std::lock_guard<std::mutex> lock(g_generator);
      torch::manual_seed(5);
      one_layer = torch::nn::Sequential(torch::nn::Linear(torch::nn::LinearOptions(24, 12).bias(false)));
    }
    auto copy = [&] {
      const std::lock_guard<std::mutex> lock(g_generator);
      return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(one_layer->clone()));
    };
    PowerSgdOptions o;
    o.start_iter = 2;
    const auto hook = powersgd_hook(o);
    // One sample (the batch's first row, the same on both ranks).
    DdpOptions options;
    torch::nn::Sequential a = copy(), b = copy();
    DistributedDataParallel plain(a, group, options), compressed(b, group, options);
    compressed.register_comm_hook(hook);
    for (int step = 0; step < 4; ++step) {
      const at::Tensor x = batch(0, step, true).narrow(0, 0, 1);
      for (auto* m : {&a, &b}) (*m)->zero_grad();
      plain.forward(x).pow(2).sum().backward();
      compressed.forward(x).pow(2).sum().backward();
      EXPECT_TRUE(at::allclose(b->parameters()[0].grad(), a->parameters()[0].grad(), 1e-5, 1e-6))
          << "rank " << rank << " step " << step;
    }
    // The weight, 12 x 24 at rank 1: 36 values sent instead of 288, from the third step on.
    EXPECT_EQ(hook->numel_before(), 2 * 288);
    EXPECT_EQ(hook->numel_after(), 2 * 36);
  });
}

// Buckets of one parameter each: the biases (16 and 8 values) are not worth compressing at
// rate 2, so their buckets go whole in one all-reduce, their gradients DDP's (up to the
// errors, which sum to zero over the ranks); the weights are compressed.
TEST(PowerSgd, ABucketWithNothingToCompressIsAllReducedWhole) {
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    DdpOptions options;
    options.bucket_cap_mb = 1e-6;  // every parameter a bucket of its own
    options.first_bucket_cap_mb = 1e-6;
    torch::nn::Sequential a = make_model(), b = make_model();
    DistributedDataParallel plain(a, group, options), compressed(b, group, options);
    PowerSgdOptions o;
    o.start_iter = 2;
    const auto hook = powersgd_hook(o);
    compressed.register_comm_hook(hook);
    for (int step = 0; step < 4; ++step) {
      for (auto* m : {&a, &b}) (*m)->zero_grad();
      plain.forward(batch(rank, step)).pow(2).mean().backward();
      compressed.forward(batch(rank, step)).pow(2).mean().backward();
      const auto pa = a->named_parameters(), pb = b->named_parameters();
      for (const char* bias : {"0.bias", "1.bias", "2.bias"}) {
        EXPECT_TRUE(at::allclose(pb[bias].grad(), pa[bias].grad(), 1e-5, 1e-6)) << bias << " step " << step;
      }
    }
    EXPECT_LT(hook->numel_after(), hook->numel_before());
  });
}

// A hook made anew from another's state after 3 steps (its error, warm-start matrices,
// random draws and counts) takes over and the run ends where 6 steps with one hook end, to
// the bit: the state is all a resumed run needs. (A resumed DDP's first step still fills
// its buckets in the parameters' reverse order before it learns the backward's: the state
// is kept by bucket, so that step starts PowerSGD's afresh.)
TEST(PowerSgd, AHookMadeFromAnothersStateContinuesItsRun) {
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    PowerSgdOptions o;
    o.matrix_approximation_rank = 2;
    o.start_iter = 2;
    const std::vector<StateDict> straight = train(rank, group, powersgd_hook(o), 6);
    torch::nn::Sequential model = make_model();
    DdpOptions options;
    options.bucket_cap_mb = 0.001;
    options.first_bucket_cap_mb = 0.001;
    DistributedDataParallel ddp(model, group, options);
    const auto first = powersgd_hook(o);
    ddp.register_comm_hook(first);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < 6; ++step) {
      if (step == 3) {
        const auto second = powersgd_hook(o);
        second->load_state_dict(first->state_dict());
        EXPECT_EQ(second->iterations(), 3);
        ddp.register_comm_hook(second);
      }
      sgd.zero_grad();
      ddp.forward(batch(rank, step)).pow(2).mean().backward();
      sgd.step();
    }
    expect_close(state_dict(*model), straight.back(), 0, "rank " + std::to_string(rank));
  });
}

TEST(PowerSgd, RefusesOptionsPyTorchRefuses) {
  PowerSgdOptions o;
  o.start_iter = 1;
  EXPECT_THROW_MSG(powersgd_hook(o), InvalidArgumentError, "with error feedback or warm start use more than 1");
  o.start_iter = 10;
  o.matrix_approximation_rank = 0;
  EXPECT_THROW_MSG(powersgd_hook(o), InvalidArgumentError, "the rank is 0");
  EXPECT_THROW_MSG(powersgd_hook().get()->load_state_dict(StateDict()), InvalidArgumentError,
                   "is it a PowerSGD hook's?");
}

}  // namespace powersgd_hook_test
}  // namespace datapar
