#include "datapar/models/resnet18.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <string>
#include <vector>

#include "datapar/error.h"
#include "datapar/state_dict.h"
#include "testing/expect_throw.h"

namespace datapar::models {
namespace {

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

TEST(ResNet18, HasD2lsShapesAndNames) {
  ResNet18 net;
  net->eval();
  EXPECT_EQ(net->forward(at::zeros({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
  // d2l's resnet18(10, 1) in PyTorch has 11,175,818 parameters and 127 state-dict entries.
  EXPECT_EQ(parameter_count(*net), 11175818);
  const auto keys = state_dict(*net).keys();
  ASSERT_EQ(keys.size(), 127u);
  EXPECT_EQ(keys[0], "0.weight");
  EXPECT_EQ(keys[6], "1.num_batches_tracked");
  EXPECT_EQ(keys[7], "resnet_block1.0.conv1.weight");
  EXPECT_EQ(keys.back(), "fc.1.bias");
  const StateDict sd = state_dict(*net);
  EXPECT_EQ(sd["resnet_block2.0.conv1.weight"].sizes(), (std::vector<int64_t>{128, 64, 3, 3}));
  EXPECT_EQ(sd["resnet_block2.0.conv3.weight"].sizes(), (std::vector<int64_t>{128, 64, 1, 1}));
  EXPECT_EQ(sd.find("resnet_block1.0.conv3.weight"), nullptr);  // the first stage keeps its shape
  EXPECT_EQ(sd["fc.1.weight"].sizes(), (std::vector<int64_t>{10, 512}));
  ResNet18 rgb(100, 3);
  EXPECT_EQ(rgb->forward(at::zeros({1, 3, 32, 32})).sizes(), (std::vector<int64_t>{1, 100}));
}

TEST(ResNet18, ResidualBlocksDownsampleOnlyWithAShortcutConv) {
  Residual keep(8, 8);
  Residual down(8, 16, /*use_1x1conv=*/true, /*stride=*/2);
  EXPECT_EQ(keep->forward(at::randn({2, 8, 14, 14})).sizes(), (std::vector<int64_t>{2, 8, 14, 14}));
  EXPECT_EQ(down->forward(at::randn({2, 8, 14, 14})).sizes(), (std::vector<int64_t>{2, 16, 7, 7}));
  EXPECT_THROW_MSG(Residual(8, 16), InvalidArgumentError, "pass use_1x1conv = true");
  // Outputs are ReLUs of a sum: never negative.
  EXPECT_GE(down->forward(at::randn({2, 8, 14, 14})).min().item<float>(), 0.0f);
}

TEST(ResNet18, ClonesAndTrains) {
  torch::manual_seed(0);
  ResNet18 net;
  const at::Tensor x = at::rand({4, 1, 28, 28});
  const at::Tensor y = at::tensor({0, 3, 5, 9}, at::kLong);
  net->eval();
  auto copy = std::dynamic_pointer_cast<ResNet18Impl>(net->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(at::allclose(copy->forward(x), net->forward(x)));
  // Every parameter is in the graph. (Biases of convs that feed a BatchNorm get a zero
  // gradient in training mode, as in PyTorch, so only weights must be non-zero.)
  net->train();
  at::cross_entropy_loss(net->forward(x), y).backward();
  for (const auto& p : net->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    if (p.key().size() > 7 && p.key().substr(p.key().size() - 7) == ".weight") {
      EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
    }
  }
}

}  // namespace
}  // namespace datapar::models
