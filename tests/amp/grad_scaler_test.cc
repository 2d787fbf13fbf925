// datapar::amp::GradScaler against PyTorch's GradScaler rules: the same steps as training
// without it while nothing overflows; a step with an inf or NaN gradient skipped and the scale
// halved; the scale doubled after growth_interval clean steps; every rank of a group skipping
// together; misuse refused.
#include "datapar/amp/grad_scaler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <limits>
#include <memory>
#include <vector>

#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"

namespace datapar::amp {
namespace {

namespace optim = torch::optim;

// A linear layer and its SGD with momentum; backward() of a fixed batch's squared loss,
// scaled by `scaler` when given.
struct Net {
  explicit Net(int64_t seed) : linear([seed] {
    torch::manual_seed(seed);
    return torch::nn::Linear(4, 3);
  }()), sgd(linear->parameters(), optim::SGDOptions(0.1).momentum(0.9)) {}
  void backward(GradScaler* scaler) {
    sgd.zero_grad();
    const at::Tensor loss = linear->forward(at::linspace(-1, 1, 8).view({2, 4})).pow(2).sum();
    (scaler != nullptr ? scaler->scale(loss) : loss).backward();
  }
  torch::nn::Linear linear;
  optim::SGD sgd;
};

void expect_same(const Net& a, const Net& b) {
  for (size_t i = 0; i < a.linear->parameters().size(); ++i) {
    EXPECT_TRUE(at::allclose(a.linear->parameters()[i], b.linear->parameters()[i], 0, 1e-7)) << "parameter " << i;
  }
}

TEST(GradScaler, StepsAsTrainingWithoutItWhileNothingOverflows) {
  Net plain(1), scaled(1);
  GradScaler scaler;
  for (int step = 0; step < 4; ++step) {
    plain.backward(nullptr);
    plain.sgd.step();
    scaled.backward(&scaler);
    EXPECT_TRUE(at::allclose(scaled.linear->weight.grad(), plain.linear->weight.grad() * 65536.0, 1e-6, 0));
    EXPECT_TRUE(scaler.step(scaled.sgd));
    EXPECT_TRUE(at::allclose(scaled.linear->weight.grad(), plain.linear->weight.grad(), 0, 1e-7)) << "unscaled";
    scaler.update();
  }
  expect_same(plain, scaled);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 4);
}

TEST(GradScaler, AnOverflowSkipsTheStepAndHalvesTheScaleAndCleanStepsGrowItBack) {
  Net net(2), before(2);
  GradScalerOptions options;
  options.growth_interval = 2;
  GradScaler scaler(options);
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    net.backward(&scaler);
    net.linear->bias.mutable_grad()[1] = bad;  // as a float16 forward would overflow
    EXPECT_FALSE(scaler.step(net.sgd)) << bad;
    scaler.update();
    expect_same(net, before);
    EXPECT_TRUE(net.sgd.state().empty()) << "the skipped step left no momentum";
  }
  EXPECT_EQ(scaler.get_scale(), 16384.0);  // halved twice
  EXPECT_EQ(scaler.growth_tracker(), 0);
  for (int step = 0; step < 2; ++step) {
    net.backward(&scaler);
    EXPECT_TRUE(scaler.step(net.sgd));
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 32768.0) << "doubled after growth_interval clean steps";
  EXPECT_EQ(scaler.growth_tracker(), 0);
  GradScaler restored;
  restored.load_state_dict(scaler.state_dict());
  EXPECT_EQ(restored.state_dict(), scaler.state_dict());
  EXPECT_EQ(scaler.state_dict().at("growth_interval"), 2);
}

TEST(GradScaler, AnOverflowOnOneRankSkipsTheStepOnEvery) {
  testing::run_gloo_ranks(2, [](int rank, std::shared_ptr<ProcessGroup> group) {
    Net shard(10 + rank);  // each rank's optimizer steps other parameters, as ZeRO's and FSDP's
    GradScalerOptions options;
    options.group = group;
    GradScaler scaler(options);
    shard.backward(&scaler);
    if (rank == 1) shard.linear->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(scaler.step(shard.sgd)) << "rank " << rank;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0) << "rank " << rank;
    shard.backward(&scaler);
    EXPECT_TRUE(scaler.step(shard.sgd)) << "rank " << rank;
    scaler.update();
  });
}

// For a caller that agrees on overflows itself (fault-tolerant training): unscale_gradients
// divides the gradients it is given and says whether they are finite, noting nothing (no
// step is blocked, update() without a verdict is still refused); update(verdict) moves the
// scale as update() would.
TEST(GradScaler, UnscaleGradientsLeavesTheVerdictToTheCaller) {
  Net net(4), plain(4);
  GradScaler scaler;
  net.backward(&scaler);
  plain.backward(nullptr);
  const std::vector<at::Tensor> gradients{net.linear->weight.grad(), net.linear->bias.grad(), at::Tensor()};
  EXPECT_TRUE(scaler.unscale_gradients(gradients));
  EXPECT_TRUE(net.linear->weight.grad().equal(plain.linear->weight.grad())) << "unscaled in place, exactly (2^16)";
  EXPECT_THROW_MSG(scaler.update(), InvalidArgumentError, "no optimizer was unscaled or stepped");
  net.linear->bias.mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(scaler.unscale_gradients(gradients));
  scaler.update(/*found_inf=*/true);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  scaler.update(/*found_inf=*/false);
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_THROW_MSG(scaler.unscale_gradients({at::ones({2}, at::kHalf)}), InvalidArgumentError,
                   "a float16 gradient cannot be unscaled");
}

TEST(GradScaler, MisuseIsRefused) {
  Net net(3);
  GradScaler scaler;
  EXPECT_THROW_MSG(scaler.update(), InvalidArgumentError, "no optimizer was unscaled or stepped since the last update()");
  net.backward(&scaler);
  scaler.unscale(net.sgd);
  EXPECT_THROW_MSG(scaler.unscale(net.sgd), InvalidArgumentError, "unscaled already since the last update()");
  scaler.update();
  torch::nn::Linear half(2, 2);
  half->to(at::kHalf);
  half->weight.mutable_grad() = at::ones({2, 2}, at::kHalf);
  optim::SGD half_sgd(half->parameters(), optim::SGDOptions(0.1));
  EXPECT_THROW_MSG(scaler.step(half_sgd), InvalidArgumentError, "a float16 gradient cannot be unscaled");
  EXPECT_THROW_MSG(scaler.scale(at::ones({1}, at::kLong)), InvalidArgumentError, "must be a floating-point tensor");
  EXPECT_THROW_MSG(GradScaler(GradScalerOptions{0.0}), InvalidArgumentError, "init_scale 0 must be positive");
  GradScalerOptions bad;
  bad.backoff_factor = 1.5;
  EXPECT_THROW_MSG(GradScaler{bad}, InvalidArgumentError, "backoff_factor 1.5 must be in (0, 1)");
  EXPECT_THROW_MSG(scaler.load_state_dict({}), InvalidArgumentError, "the state is empty");
  auto state = scaler.state_dict();
  state["scale"] = std::numeric_limits<double>::infinity();
  EXPECT_THROW_MSG(scaler.load_state_dict(state), InvalidArgumentError, "init_scale inf must be positive and finite");
  EXPECT_EQ(scaler.get_scale(), 65536.0) << "a refused state changes nothing";
  GradScalerOptions off;
  off.enabled = false;
  GradScaler disabled(off);
  EXPECT_TRUE(disabled.state_dict().empty());
  EXPECT_EQ(disabled.get_scale(), 1.0);
}

}  // namespace
}  // namespace datapar::amp
