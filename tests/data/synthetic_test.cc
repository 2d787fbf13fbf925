#include "datapar/data/synthetic.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <vector>

#include "datapar/error.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

SyntheticImagesOptions sized(int64_t size, uint64_t seed = 0, bool train = true) {
  SyntheticImagesOptions o;
  o.size = size;
  o.seed = seed;
  o.train = train;
  return o;
}

TEST(SyntheticImages, HasFashionMnistShapesAndBalancedLabels) {
  TensorDataset d = make_synthetic_images(sized(1003));
  EXPECT_EQ(d.data().sizes(), (std::vector<int64_t>{1003, 1, 28, 28}));
  EXPECT_EQ(d.data().scalar_type(), at::kFloat);
  EXPECT_EQ(d.target().scalar_type(), at::kLong);
  EXPECT_GE(d.data().min().item<float>(), 0.0f);
  EXPECT_LE(d.data().max().item<float>(), 1.0f);
  // 1003 = 100 * 10 + 3: classes 0..2 get 101 samples, the rest 100.
  const at::Tensor counts = d.target().bincount({}, 10);
  EXPECT_TRUE(at::equal(counts, at::tensor({101, 101, 101, 100, 100, 100, 100, 100, 100, 100}, at::kLong)));
  EXPECT_EQ(make_synthetic_images(sized(0)).size(), 0);
}

TEST(SyntheticImages, IsDeterministicInTheSeed) {
  TensorDataset a = make_synthetic_images(sized(200, 5));
  TensorDataset b = make_synthetic_images(sized(200, 5));
  TensorDataset c = make_synthetic_images(sized(200, 6));
  TensorDataset test = make_synthetic_images(sized(200, 5, false));
  EXPECT_TRUE(at::equal(a.data(), b.data()));
  EXPECT_TRUE(at::equal(a.target(), b.target()));
  EXPECT_FALSE(at::equal(a.data(), c.data()));
  EXPECT_FALSE(at::equal(a.data(), test.data()));
  // Noise-free samples are their class prototype: the same for train and test of a seed.
  SyntheticImagesOptions clean = sized(20, 5);
  clean.noise = 0;
  TensorDataset p = make_synthetic_images(clean);
  clean.train = false;
  TensorDataset q = make_synthetic_images(clean);
  for (int64_t i = 0; i < 20; ++i) {
    for (int64_t j = 0; j < 20; ++j) {
      if (p.target()[i].item<int64_t>() == q.target()[j].item<int64_t>()) {
        ASSERT_TRUE(at::equal(p.data()[i], q.data()[j]));
      }
    }
  }
}

// A linear classifier trained on the train split beats chance by far on the test split.
TEST(SyntheticImages, LabelsAreLearnable) {
  torch::manual_seed(0);
  TensorDataset train = make_synthetic_images(sized(2000, 1));
  TensorDataset test = make_synthetic_images(sized(500, 1, false));
  torch::nn::Linear model(784, 10);
  torch::optim::SGD sgd(model->parameters(), 0.5);
  const at::Tensor x = train.data().flatten(1);
  double first_loss = 0;
  double last_loss = 0;
  for (int step = 0; step < 60; ++step) {
    const at::Tensor rows = at::arange(step * 100 % 2000, step * 100 % 2000 + 100, at::kLong);
    sgd.zero_grad();
    at::Tensor loss = torch::nn::functional::cross_entropy(model(x.index_select(0, rows)),
                                                           train.target().index_select(0, rows));
    loss.backward();
    sgd.step();
    (step == 0 ? first_loss : last_loss) = loss.item<double>();
  }
  const double accuracy =
      model(test.data().flatten(1)).argmax(1).eq(test.target()).to(at::kDouble).mean().item<double>();
  EXPECT_LT(last_loss, first_loss / 4) << first_loss << " -> " << last_loss;
  EXPECT_GT(accuracy, 0.9);
}

TEST(SyntheticImages, RejectsBadOptions) {
  EXPECT_THROW_MSG(make_synthetic_images(sized(-1)), InvalidArgumentError, "size is -1");
  SyntheticImagesOptions o;
  o.num_classes = 0;
  EXPECT_THROW_MSG(make_synthetic_images(o), InvalidArgumentError, "num_classes is 0");
  o = {};
  o.height = 0;
  EXPECT_THROW_MSG(make_synthetic_images(o), InvalidArgumentError, "image shape 1x0x28");
}

}  // namespace
}  // namespace datapar
