// SliceGradients (Note [Gradients that do not depend on who is alive]): a global batch cut
// into fixed slices gets the same gradient, to the bit, whether 1, 2 or 3 members train
// them; and that gradient is the whole batch's.
#include "datapar/ft/slice_gradients.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <map>
#include <mutex>
#include <vector>

#include "testing/gloo_ranks.h"

namespace datapar::ft {
namespace {

constexpr int kSlices = 3;

torch::nn::Sequential make_net() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(5, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
}

struct Batch {
  at::Tensor x, y;
  explicit Batch(int64_t rows) {
    at::Generator g = at::detail::createCPUGenerator(5);
    x = at::randn({rows, 5}, g);
    y = at::randn({rows, 3}, g);
  }
};

// Every parameter's gradient after `size` members (threads) trained their slices of `batch`.
std::vector<at::Tensor> reduced_gradients(int size, const Batch& batch) {
  std::vector<at::Tensor> out;
  std::mutex mutex;
  const torch::nn::Sequential source = make_net();  // here: threads would race on the seed
  testing::run_gloo_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential net(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(source->clone()));
    detail::SliceGradients gradients(net->parameters());
    gradients.begin(rank, size, kSlices);
    const SliceRange mine = slices_of(rank, size, kSlices);
    for (int i = mine.first; i < mine.last; ++i) {
      const Slice slice{i, kSlices};
      const int64_t n = batch.x.size(0), begin = slice.begin(n), rows = slice.end(n) - begin;
      torch::nn::functional::mse_loss(net->forward(batch.x.narrow(0, begin, rows)), batch.y.narrow(0, begin, rows))
          .backward();
      gradients.keep(rows);
    }
    gradients.reduce(*group);
    std::lock_guard<std::mutex> lock(mutex);
    if (rank == 0) {
      for (const at::Tensor& p : net->parameters()) out.push_back(p.grad().clone());
    }
  });
  return out;
}

void expect_same_gradients(int rows) {
  const Batch batch(rows);
  const std::vector<at::Tensor> three = reduced_gradients(3, batch);
  ASSERT_FALSE(three.empty());
  for (int size : {1, 2}) {
    const std::vector<at::Tensor> other = reduced_gradients(size, batch);
    ASSERT_EQ(other.size(), three.size());
    for (size_t i = 0; i < three.size(); ++i) {
      EXPECT_TRUE(at::equal(other[i], three[i])) << size << " members, parameter " << i << ": "
                                                 << (other[i] - three[i]).abs().max().item<double>();
    }
  }
  // The whole batch's gradient, as one process computes it.
  torch::nn::Sequential net = make_net();
  torch::nn::functional::mse_loss(net->forward(batch.x), batch.y).backward();
  const std::vector<at::Tensor> params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::allclose(three[i], params[i].grad(), 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST(SliceGradients, SlicesOfEqualRowsGiveTheSameBitsWhoeverTrainsThem) { expect_same_gradients(12); }

// 10 rows in three: 3, 3 and 4, each weighted by its rows.
TEST(SliceGradients, SlicesOfUnequalRowsGiveTheSameBitsWhoeverTrainsThem) { expect_same_gradients(10); }

TEST(SliceGradients, SlicesAreContiguousAndEvenInRankOrder) {
  EXPECT_EQ(slices_of(0, 2, 3).first, 0);
  EXPECT_EQ(slices_of(0, 2, 3).last, 1);
  EXPECT_EQ(slices_of(1, 2, 3).first, 1);
  EXPECT_EQ(slices_of(1, 2, 3).last, 3);
  EXPECT_EQ(slices_of(3, 4, 3).last - slices_of(3, 4, 3).first, 1);
  int covered = 0;
  for (int r = 0; r < 5; ++r) covered += slices_of(r, 5, 3).last - slices_of(r, 5, 3).first;
  EXPECT_EQ(covered, 3);  // a member beyond the slices trains none
}

}  // namespace
}  // namespace datapar::ft
