// Tests that need CUDA devices (CTest label `gpu`; `make test-gpu` on a GPU machine). Where
// there is none, or datapar was built without CUDA, each reports itself skipped with the
// reason. They check issue "CUDA semantics": the reference cases on GPUs, DataParallel's copy
// replicas never stale, and the NCCL backend against closed-form values, single-process
// training and a killed rank.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <string>
#include <vector>

#include "datapar/config.h"
#include "datapar/datapar.h"
#include "testing/models.h"
#include "testing/processes.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;
using testing::ConvNet;
using testing::relative_error;

// Skips the test unless `n` CUDA devices are visible to a CUDA build of datapar.
#define DATAPAR_REQUIRE_GPUS(n)                                                                        \
  do {                                                                                                 \
    if (!DATAPAR_HAVE_CUDA) GTEST_SKIP() << "datapar was built without CUDA (a CPU libtorch)";        \
    const int visible = static_cast<int>(torch::cuda::device_count());                                \
    if (visible < (n))                                                                                 \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices; torch::cuda::device_count() is " << visible; \
  } while (0)

std::vector<Device> gpus(int n) {
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cuda(i));
  return devices;
}

ConvNet copy_to(const ConvNet& source, const at::Device& device) {
  ConvNet copy;
  load_state_dict(*copy, state_dict(*source));
  copy->to(device);
  return copy;
}

TEST(Gpu, TutorialChunkSizes) {
  DATAPAR_REQUIRE_GPUS(2);
  const int n = torch::cuda::device_count() >= 4 ? 4 : 2;
  auto model = torch::nn::Linear(5, 2);
  model->to(at::Device(at::kCUDA, 0));
  DataParallel dp(model, gpus(n));
  const std::vector<int64_t> want30 = n == 4 ? std::vector<int64_t>{8, 8, 8, 6} : std::vector<int64_t>{15, 15};
  const std::vector<int64_t> want10 = n == 4 ? std::vector<int64_t>{3, 3, 3, 1} : std::vector<int64_t>{5, 5};
  const at::Tensor out = dp(at::randn({30, 5}, at::Device(at::kCUDA, 0)));
  EXPECT_EQ(dp.last_chunk_sizes(), want30);
  EXPECT_EQ(out.device(), at::Device(at::kCUDA, 0));
  (void)dp(at::randn({10, 5}, at::Device(at::kCUDA, 0)));
  EXPECT_EQ(dp.last_chunk_sizes(), want10);
}

TEST(Gpu, FunctionalDataParallelSplits16And15) {
  DATAPAR_REQUIRE_GPUS(2);
  const std::vector<Device> devices = gpus(2);
  torch::nn::Linear module(10, 20);
  module->to(at::Device(at::kCUDA, 0));
  auto replicas = replicate(module, devices);
  for (const auto& [rows, first, second] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 8, 8}, {15, 8, 7}}) {
    const at::Tensor input = at::randn({rows, 10}, at::Device(at::kCUDA, 0));
    const std::vector<at::Tensor> chunks = scatter(input, devices);
    ASSERT_EQ(chunks.size(), 2u);
    EXPECT_EQ(chunks[0].size(0), first);
    EXPECT_EQ(chunks[1].size(0), second);
    EXPECT_EQ(chunks[1].device(), at::Device(at::kCUDA, 1));
    const std::vector<at::Tensor> outputs = parallel_apply(replicas, chunks, devices);
    const at::Tensor output = gather(outputs, devices[0]);
    EXPECT_LT(relative_error(output, module(input)), 1e-5);
  }
}

// The copy replicas that CUDA devices use must follow every update of the master, also
// libtorch SGD's, which writes through p.data() and moves no version counter.
TEST(Gpu, DataParallelFiveSgdStepsMatchOneGpu) {
  DATAPAR_REQUIRE_GPUS(2);
  const at::Device gpu0(at::kCUDA, 0);
  torch::manual_seed(3);
  ConvNet model;
  ConvNet reference = copy_to(model, gpu0);
  model->to(gpu0);
  DataParallel dp(model, gpus(2));
  torch::optim::SGD sgd(dp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  torch::optim::SGD sgd_ref(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = at::randn({24, 1, 12, 12}, gpu0);
    const at::Tensor y = at::randint(0, 10, {24}, at::TensorOptions(gpu0).dtype(at::kLong));
    sgd.zero_grad();
    at::cross_entropy_loss(dp(x), y).backward();
    sgd.step();
    sgd_ref.zero_grad();
    at::cross_entropy_loss(reference(x), y).backward();
    sgd_ref.step();
  }
  const auto got = model->named_parameters();
  const auto want = reference->named_parameters();
  for (size_t j = 0; j < got.size(); ++j) {
    EXPECT_LT(relative_error(got[j].value(), want[j].value()), 1e-5) << got[j].key();
  }
}

// A linear layer whose forward also runs `matmuls_per_row` 1024x1024 products per row on its
// device: a slower GPU, as the GPU sees it (the host only queues the work).
class BusyLinearImpl : public torch::nn::Cloneable<BusyLinearImpl> {
 public:
  BusyLinearImpl() { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(8, 4)); }
  at::Tensor forward(const at::Tensor& x) {
    if (matmuls_per_row > 0) {
      const at::Tensor a = at::randn({1024, 1024}, x.options());
      at::Tensor sink = a;
      for (int64_t i = 0; i < matmuls_per_row * x.size(0); ++i) sink = at::mm(a, sink).tanh_();
      (void)sink;
    }
    return linear(x);
  }
  torch::nn::Linear linear{nullptr};
  int64_t matmuls_per_row = 0;
};
TORCH_MODULE(BusyLinear);

// auto_balance times each device's work once the device finished it (the stream
// synchronised), not when the host queued it: the GPU with more work gets fewer rows.
TEST(Gpu, DataParallelAutoBalanceMeasuresTheDevicesNotTheHost) {
  DATAPAR_REQUIRE_GPUS(2);
  const at::Device gpu0(at::kCUDA, 0);
  torch::manual_seed(3);
  BusyLinear model;
  BusyLinear reference;
  load_state_dict(*reference, state_dict(*model));
  model->to(gpu0);
  reference->to(gpu0);
  DataParallelOptions options;
  options.devices = gpus(2);
  options.auto_balance = true;
  DataParallel dp(model, options);
  dp.replicas()[1]->matmuls_per_row = 4;
  for (int step = 0; step < 12; ++step) {
    const at::Tensor x = at::randn({64, 8}, gpu0);
    const at::Tensor y = at::randint(0, 4, {64}, at::TensorOptions(gpu0).dtype(at::kLong));
    model->zero_grad();
    reference->zero_grad();
    at::cross_entropy_loss(dp(x), y).backward();
    at::cross_entropy_loss(reference(x), y).backward();
    EXPECT_LT(relative_error(model->linear->weight.grad(), reference->linear->weight.grad()), 1e-5) << step;
  }
  const std::vector<int64_t> split = dp.last_chunk_sizes();
  ASSERT_EQ(split.size(), 2u);
  EXPECT_GT(split[0], 2 * split[1]) << split[0] << "/" << split[1];
  EXPECT_GE(dp.balancer()->rebalances(), 1);
}

// Multi-process NCCL jobs: tests/gpu/nccl_probe.cc, one process per GPU.
std::vector<testing::ProcessResult> run_nccl_job(const std::string& scenario, int world, std::chrono::seconds deadline) {
  const testing::TempDir temp("nccl_" + scenario);
  const std::string& dir = temp.path();
  const std::string init = "file://" + dir + "/rendezvous";
  std::vector<std::vector<std::string>> commands;
  for (int rank = 0; rank < world; ++rank) {
    commands.push_back({DATAPAR_BIN_DIR "/nccl_probe", scenario, init, std::to_string(rank), std::to_string(world)});
  }
  return testing::run_processes(commands, dir, deadline);
}

void expect_all_passed(const std::vector<testing::ProcessResult>& results) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "rank " << rank << ":\n" << results[rank].output;
  }
}

TEST(Gpu, NcclCollectivesGiveClosedFormValues) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("collectives", 2, 120s));
}

TEST(Gpu, DdpOnNcclEqualsSingleProcessTraining) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("ddp", 2, 180s));
}

// DDP's metadata (model check, bucket order, unused-parameter and sample flags, join) and
// SyncBatchNorm's statistics on NCCL, which refuses host tensors (issue "CUDA semantics").
TEST(Gpu, DdpMetadataJoinAndSyncBatchNormRunOnNccl) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("metadata", 2, 180s));
}

// ZeRO-1 (Adam) under DDP on NCCL equals one process with the whole Adam, and the timeline
// records NCCL's bucket all-reduces (tests/gpu/nccl_probe.cc, zero_trace).
TEST(Gpu, ZeroAndTheTimelineOnNccl) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("zero_trace", 2, 180s));
}

TEST(Gpu, AKilledRankIsACommErrorWithinTheTimeout) {
  DATAPAR_REQUIRE_GPUS(2);
  const auto start = std::chrono::steady_clock::now();
  const auto results = run_nccl_job("kill", 2, 120s);
  // Rank 1 SIGKILLs itself; rank 0 must fail its all_reduce with CommError (exit 0 means it did).
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 90s);
}

}  // namespace
}  // namespace datapar
