#include "datapar/parallel/parallel_apply.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "datapar/error.h"
#include "datapar/parallel/scatter_gather.h"
#include "testing/expect_throw.h"
#include "testing/models.h"

namespace datapar {
namespace {

using testing::relative_error;

// The functional example: replicate, scatter, parallel_apply, gather.
TEST(ParallelApply, FunctionalPipelineMatchesTheModule) {
  torch::nn::Linear master(10, 20);
  const auto devices = cpu_devices(2);
  auto replicas = replicate(master, devices);
  for (int64_t n : {16, 15}) {
    const auto x = at::randn({n, 10});
    auto inputs = scatter(x, devices);
    auto outputs = parallel_apply(replicas, inputs, devices);
    ASSERT_EQ(outputs.size(), 2u);
    EXPECT_EQ(outputs[0].size(0), 8);
    EXPECT_EQ(outputs[1].size(0), n - 8);
    const auto y = gather(outputs, devices[0]);
    EXPECT_EQ(y.sizes(), at::IntArrayRef({n, 20}));
    EXPECT_LT(relative_error(y, master(x)), 1e-6);
  }
}

TEST(ParallelApply, GradientsReachTheMasterAndTheInput) {
  torch::nn::Linear master(10, 20);
  const auto devices = cpu_devices(3);
  auto replicas = replicate(master, devices);
  const auto x = at::randn({15, 10}).requires_grad_();
  const auto y = gather(parallel_apply(replicas, scatter(x, devices), devices), devices[0]);
  (y * y).sum().backward();

  torch::nn::Linear reference(10, 20);
  {
    at::NoGradGuard no_grad;
    reference->weight.copy_(master->weight);
    reference->bias.copy_(master->bias);
  }
  const auto x_ref = x.detach().clone().requires_grad_();
  const auto y_ref = reference(x_ref);
  (y_ref * y_ref).sum().backward();
  EXPECT_LT(relative_error(master->weight.grad(), reference->weight.grad()), 1e-5);
  EXPECT_LT(relative_error(master->bias.grad(), reference->bias.grad()), 1e-5);
  EXPECT_LT(relative_error(x.grad(), x_ref.grad()), 1e-5);
  // Replica leaves never collect .grad: nothing to race on.
  for (const auto& r : replicas) EXPECT_FALSE(r->weight.grad().defined());
}

TEST(ParallelApply, RunsOnlyAsManyReplicasAsThereAreInputs) {
  auto log = std::make_shared<testing::ThreadLog>();
  testing::ThreadProbe master(log);
  const auto devices = cpu_devices(4);
  auto replicas = replicate(master, devices);
  auto inputs = scatter(at::randn({2, 5}), devices);  // 2 rows: 2 chunks
  ASSERT_EQ(inputs.size(), 2u);
  auto outputs = parallel_apply(replicas, inputs, devices);
  EXPECT_EQ(outputs.size(), 2u);
  gather(outputs, devices[0]).sum().backward();
  EXPECT_EQ(log->backward_threads.size(), 2u);
}

TEST(ParallelApply, ReplicaFailureNamesTheDevice) {
  testing::TwoHeads master(/*min_rows=*/2);
  const auto devices = cpu_devices(4);
  auto replicas = replicate(master, devices);
  const auto packed = c10::ivalue::Tuple::create({at::randn({10, 4}), at::randn({10, 3}), 1.0});
  auto inputs = scatter(packed, devices);  // 3,3,3,1: the last one is too small
  auto call = [](testing::TwoHeadsImpl& m, const c10::IValue& in) {
    const auto& e = in.toTupleRef().elements();
    return m.forward(e[0].toTensor(), e[1].toTensor(), e[2].toDouble());
  };
  EXPECT_THROW_MSG(parallel_apply(replicas, inputs, devices, call), Error,
                   "parallel_apply: replica on cpu:3 failed: chunk too small: 1 rows");
}

TEST(ParallelApply, ChecksItsArguments) {
  torch::nn::Linear master(3, 3);
  auto replicas = replicate(master, cpu_devices(2));
  const auto chunks = scatter(at::randn({4, 3}), cpu_devices(2));
  EXPECT_THROW_MSG(parallel_apply(replicas, chunks, {Device::cpu(1), Device::cpu(0)}), InvalidArgumentError,
                   "replica 0 lives on cpu:0");
  EXPECT_THROW_MSG(parallel_apply(replicas, std::vector<at::Tensor>{}, cpu_devices(2)), InvalidArgumentError,
                   "0 inputs for 2 replicas");
}

}  // namespace
}  // namespace datapar
