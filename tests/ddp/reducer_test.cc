// DDP's reducer with its ranks as threads of one process (one Gloo group over loopback), so
// that the reducer, its autograd hooks and the group's threads run side by side in one
// address space, where ThreadSanitizer sees them (datapar_thread_tests); ddp_test runs
// ranks as processes, as users do. CPU only: two ranks that are threads cannot share a
// GPU's backward thread (testing/sync_batch_norm_check.h).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <mutex>
#include <vector>

#include "datapar/ddp/distributed_data_parallel.h"
#include "testing/gloo_ranks.h"

namespace datapar {
namespace {

// The default generator is not thread-safe, and constructing or cloning a module draws
// from it.
std::mutex g_generator;

// The gradients one process would get on rank r's inputs, averaged over the ranks: what
// every rank's DDP gradients must be.
std::vector<at::Tensor> averaged_gradients(const torch::nn::Sequential& model, const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> sum;
  for (const at::Tensor& x : inputs) {
    std::shared_ptr<torch::nn::SequentialImpl> copy;
    {
      const std::lock_guard<std::mutex> lock(g_generator);
      copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
    }
    copy->forward(x).pow(2).sum().backward();
    const auto params = copy->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (sum.size() <= i) sum.push_back(at::zeros_like(params[i]));
      sum[i] += params[i].grad();
    }
  }
  for (at::Tensor& g : sum) g /= static_cast<double>(inputs.size());
  return sum;
}

TEST(Reducer, RanksAsThreadsAverageTheGradientsOfEveryBucket) {
  constexpr int kWorld = 2;
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model;
    {
      const std::lock_guard<std::mutex> lock(g_generator);
      torch::manual_seed(rank);  // different on each rank: DDP starts every rank from rank 0's
      model = torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::Linear(64, 32), torch::nn::Linear(32, 4));
    }
    DdpOptions options;
    options.bucket_cap_mb = 0.004;  // about 1000 floats: several buckets, reduced while backward runs
    options.first_bucket_cap_mb = 0.001;
    DistributedDataParallel ddp(model, group, options);
    ASSERT_GE(ddp.bucket_indices().size(), 2u);
    for (int step = 0; step < 3; ++step) {
      std::vector<at::Tensor> inputs;  // every rank's, the same on all
      for (int r = 0; r < kWorld; ++r) inputs.push_back(at::full({5, 16}, 0.1 * (r + 1) + step));
      const std::vector<at::Tensor> want = averaged_gradients(model, inputs);
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      ddp.forward(inputs[rank]).pow(2).sum().backward();
      const auto params = model->parameters();
      ASSERT_EQ(params.size(), want.size());
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(at::allclose(params[i].grad(), want[i], 1e-5, 1e-6)) << "rank " << rank << " step " << step
                                                                           << " parameter " << i;
      }
    }
  });
}

}  // namespace
}  // namespace datapar
