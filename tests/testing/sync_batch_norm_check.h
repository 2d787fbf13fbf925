// SyncBatchNorm over 2 ranks (threads of one Gloo group) against BatchNorm on the
// concatenated batch in float64 (issue 26): used by the CPU tests (tests/ddp/
// sync_batch_norm_test.cc) and the gpu ones (float16 on cuda:0).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "datapar/ddp/sync_batch_norm.h"
#include "testing/gloo_ranks.h"

namespace datapar::testing {

struct Case {
  at::ScalarType dtype;
  double mean;       // of every channel's values; their spread is about 1
  double tolerance;  // on outputs and input gradients, absolute (they are about 1 in size)
  std::vector<int64_t> rows;  // per rank
  // Where each rank's batch and module live. Two ranks that are threads of one process
  // cannot share a GPU here: libtorch runs a device's backward functions on one engine
  // thread, where the first rank's all_reduce would wait for the second's forever.
  std::vector<at::Device> devices{at::kCPU, at::kCPU};
};

// Each rank normalises its rows of one batch (N, 3, 5) with SyncBatchNorm and backpropagates
// sum(out * w); the outputs, the input gradients and the running statistics must be those of
// BatchNorm over the whole batch, computed in float64.
inline void expect_matches_batch_norm_on_the_whole_batch(const Case& c) {
  const int64_t total = c.rows[0] + c.rows[1];
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor whole = (at::randn({total, 3, 5}, gen, at::kDouble) + c.mean).to(c.dtype);
  const at::Tensor w = at::randn({total, 3, 5}, gen, at::kDouble);

  // The reference: float64, on the values as the ranks hold them (rounded to dtype).
  const at::Tensor x64 = whole.to(at::kDouble).requires_grad_(true);
  at::Tensor running_mean = at::zeros({3}, at::kDouble), running_var = at::ones({3}, at::kDouble);
  const at::Tensor want = at::batch_norm(x64, {}, {}, running_mean, running_var, /*training=*/true, 0.1, 1e-5, false);
  (want * w).sum().backward();
  const at::Tensor want_grad = x64.grad();

  std::mutex mutex;
  std::vector<at::Tensor> outputs(2), grads(2), means(2), vars(2);
  run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    SyncBatchNorm bn(SyncBatchNormOptions(3));
    bn->set_process_group(group);
    bn->to(c.devices[rank]);
    const int64_t begin = rank == 0 ? 0 : c.rows[0];
    const at::Tensor x = whole.narrow(0, begin, c.rows[rank]).to(c.devices[rank]).requires_grad_(true);
    const at::Tensor out = bn->forward(x);
    (out.to(at::kDouble) * w.narrow(0, begin, c.rows[rank]).to(c.devices[rank])).sum().backward();
    std::lock_guard<std::mutex> lock(mutex);
    outputs[rank] = out.detach().to(at::kDouble).cpu();
    grads[rank] = x.grad().to(at::kDouble).cpu();
    means[rank] = bn->running_mean.to(at::kDouble).cpu();
    vars[rank] = bn->running_var.to(at::kDouble).cpu();
  });
  const at::Tensor got = at::cat(outputs), got_grad = at::cat(grads);
  const std::string name = c10::toString(c.dtype);
  EXPECT_LT((got - want).abs().max().item<double>(), c.tolerance) << name << ", mean " << c.mean;
  EXPECT_LT((got_grad - want_grad).abs().max().item<double>(), c.tolerance) << name << ", mean " << c.mean;
  for (int rank = 0; rank < 2; ++rank) {
    // Running statistics in float32: the mean to float32's precision at that size.
    EXPECT_TRUE(at::allclose(means[rank], running_mean, 1e-6, 1e-3)) << name << " rank " << rank;
    EXPECT_TRUE(at::allclose(vars[rank], running_var, 1e-2, 1e-3)) << name << " rank " << rank << ": "
                                                                 << vars[rank] << " against " << running_var;
  }
}

}  // namespace datapar::testing
