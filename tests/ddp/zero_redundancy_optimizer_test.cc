// ZeroOptions::parameters_as_bucket_view: each owner's parameters back to back in one
// buffer, broadcast in place, and the same training as with parameters in their own memory.
// (The sharded steps against one process and the checkpoints: ddp_test.cc, in processes.)
#include "datapar/ddp/zero_redundancy_optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <map>
#include <mutex>
#include <vector>

#include "testing/gloo_ranks.h"

namespace datapar {
namespace {

// The same values on every rank. The ranks are threads sharing the default generator: one
// lock around seeding and drawing, or their draws interleave and the models differ (CI of
// 8c85d9d, under AddressSanitizer: 4 of 6 parameters off on world 3).
torch::nn::Sequential make_model() {
  static std::mutex generator;
  std::lock_guard<std::mutex> lock(generator);
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(20, 30), torch::nn::Linear(30, 5), torch::nn::Linear(5, 5));
}

// Three steps of SGD with momentum on fixed gradients, sharded over `world` ranks; the
// parameters each rank ends with.
std::vector<std::vector<at::Tensor>> train(int world, bool bucket_view) {
  std::vector<std::vector<at::Tensor>> ends(world);
  testing::run_gloo_ranks(world, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = make_model();
    std::vector<at::Tensor> params = model->parameters();
    std::vector<const void*> impls;
    for (const at::Tensor& p : params) impls.push_back(p.unsafeGetTensorImpl());
    ZeroOptions options;
    options.parameters_as_bucket_view = bucket_view;
    ZeroRedundancyOptimizer zero(
        params,
        [](std::vector<at::Tensor> shard) {
          return std::make_unique<torch::optim::SGD>(shard, torch::optim::SGDOptions(0.1).momentum(0.9));
        },
        group, options);
    // Each owner's parameters lie back to back, in index order; or where they were.
    std::map<int, const char*> next;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(model->parameters()[i].unsafeGetTensorImpl(), impls[i]) << "the module's parameter " << i;
      const char* at = static_cast<const char*>(params[i].data_ptr());
      const int owner = zero.owner(i);
      if (bucket_view && next.count(owner)) EXPECT_EQ(at, next[owner]) << "parameter " << i << " of rank " << owner;
      next[owner] = at + params[i].nbytes();
    }
    for (int step = 0; step < 3; ++step) {
      zero.zero_grad();
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() = at::full_like(params[i], 0.01 * static_cast<double>(i + 1) * (step + 1));
      }
      zero.step();
    }
    for (const at::Tensor& p : params) ends[rank].push_back(p.detach().clone());
  });
  return ends;
}

TEST(ZeroRedundancyOptimizer, ParametersAsBucketViewTrainAsParametersInTheirOwnMemory) {
  // One process, the whole optimizer: what every rank must end with.
  torch::nn::Sequential model = make_model();
  std::vector<at::Tensor> params = model->parameters();
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = at::full_like(params[i], 0.01 * static_cast<double>(i + 1) * (step + 1));
    }
    sgd.step();
  }
  for (const bool bucket_view : {true, false}) {
    for (const int world : {2, 3}) {
      const auto ends = train(world, bucket_view);
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(ends[r].size(), params.size());
        for (size_t i = 0; i < params.size(); ++i) {
          EXPECT_TRUE(at::equal(ends[r][i], params[i].detach()))
              << "bucket view " << bucket_view << ", world " << world << ", rank " << r << ", parameter " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace datapar
