// Tests that need CUDA devices (CTest label `gpu`; `make test-gpu` on a GPU machine). Where
// there is none, or datapar was built without CUDA, each reports itself skipped with the
// reason and the number of GPUs it needs. They check issue "CUDA semantics": the reference
// cases on GPUs, DataParallel's copy replicas never stale, and the NCCL backend against
// closed-form values, single-process training and a killed rank; and, on ONE GPU (issue 25):
// DataParallel over unlike devices (cuda:0 beside CPU cores), DDP of models on cuda:0 over
// gloo (CUDA tensors staged through pinned host memory), 2 and 3 processes sharing the GPU.
// TF32 is off in every comparison (testing/tf32.h).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "datapar/config.h"
#include "datapar/datapar.h"
#include "datapar/train/cuda_graph_step.h"
#include "testing/crash_report.h"
#include "testing/ddp_jobs.h"
#include "testing/gloo_ranks.h"
#include "testing/models.h"
#include "testing/processes.h"
#include "testing/sync_batch_norm_check.h"
#include "testing/temp_dir.h"
#include "testing/tf32.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;
using testing::ConvNet;
using testing::relative_error;

// Skips the test unless `n` CUDA devices are visible to a CUDA build of datapar. Says how
// many it needs first, in a line that scripts/gpu_check.sh reads for its report.
#define DATAPAR_REQUIRE_GPUS(n)                                                                        \
  do {                                                                                                 \
    std::cout << "gpu test: needs " << (n) << " CUDA device(s)" << std::endl;                          \
    if (!DATAPAR_HAVE_CUDA) GTEST_SKIP() << "datapar was built without CUDA (a CPU libtorch)";        \
    const int visible = static_cast<int>(torch::cuda::device_count());                                \
    if (visible < (n))                                                                                 \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices; torch::cuda::device_count() is " << visible; \
  } while (0)

class Tf32Off : public ::testing::Environment {
 public:
  void SetUp() override {
    if (DATAPAR_HAVE_CUDA) testing::turn_off_tf32();
  }
};
const ::testing::Environment* const tf32_off = ::testing::AddGlobalTestEnvironment(new Tf32Off);
// A crash on a GPU node is reported with its stack (gpu_check.sh keeps only the log).
const bool crash_report = (testing::install_crash_report(), true);

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

// Five SGD steps (momentum, weight decay) of a ConvNet in `dtype` under DataParallel over
// `devices` (the master on cuda:0) end where the same steps on cuda:0 alone end, within
// `tolerance` (relative, over each parameter). The copy replicas must follow every update of
// the master, also libtorch SGD's, which writes through p.data() and moves no version counter.
void expect_five_sgd_steps_match_one_gpu(const std::vector<Device>& devices, at::ScalarType dtype, double tolerance) {
  const at::Device gpu0(at::kCUDA, 0);
  torch::manual_seed(3);
  ConvNet model;
  model->to(dtype);
  ConvNet reference = copy_to(model, gpu0);
  reference->to(dtype);
  model->to(gpu0);
  DataParallel dp(model, devices);
  torch::optim::SGD sgd(dp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  torch::optim::SGD sgd_ref(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = at::randn({24, 1, 12, 12}, at::TensorOptions(gpu0).dtype(dtype));
    const at::Tensor y = at::randint(0, 10, {24}, at::TensorOptions(gpu0).dtype(at::kLong));
    sgd.zero_grad();
    at::cross_entropy_loss(dp(x), y).backward();
    sgd.step();
    sgd_ref.zero_grad();
    at::cross_entropy_loss(reference(x), y).backward();
    sgd_ref.step();
    EXPECT_EQ(dp.last_chunk_sizes().size(), devices.size());
  }
  const auto got = model->named_parameters();
  const auto want = reference->named_parameters();
  for (size_t j = 0; j < got.size(); ++j) {
    EXPECT_EQ(got[j].value().device(), gpu0);
    EXPECT_LT(relative_error(got[j].value(), want[j].value()), tolerance) << dtype << " " << got[j].key();
  }
}

TEST(Gpu, DataParallelFiveSgdStepsMatchOneGpu) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_five_sgd_steps_match_one_gpu(gpus(2), at::kFloat, 1e-5);
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

// ---- One GPU: unlike devices in DataParallel -------------------------------------------

// cuda:0 and then `cpus` CPU devices.
std::vector<Device> gpu_and_cpus(int cpus) {
  std::vector<Device> devices{Device::cuda(0)};
  for (int i = 0; i < cpus; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

// PyTorch's data-parallel tutorial (Linear(5, 2), batches of 30, the last of 10; batch 25)
// on cuda:0 beside three CPU devices: the chunks, the output's device, and its values.
TEST(Gpu, UnlikeDevicesSplitLikeTheTutorial) {
  DATAPAR_REQUIRE_GPUS(1);
  const at::Device gpu0(at::kCUDA, 0);
  auto model = torch::nn::Linear(5, 2);
  model->to(gpu0);
  DataParallel dp(model, gpu_and_cpus(3));
  for (const auto& [rows, want] : std::vector<std::pair<int64_t, std::vector<int64_t>>>{
           {30, {8, 8, 8, 6}}, {10, {3, 3, 3, 1}}, {25, {7, 7, 7, 4}}}) {
    const at::Tensor x = at::randn({rows, 5}, gpu0);
    const at::Tensor out = dp(x);
    EXPECT_EQ(dp.last_chunk_sizes(), want) << rows << " rows";
    EXPECT_EQ(out.device(), gpu0);
    EXPECT_LT(relative_error(out, model(x)), 1e-6) << rows << " rows";
  }
}

// cuda:0 and a CPU device train a ConvNet as cuda:0 alone does: the CPU replica's copies
// follow every update of the GPU master, and its gradients reach the master's .grad. Within
// 1e-9 in float64; in float32 within 1e-5: the CPU and the GPU sum in different orders.
TEST(Gpu, UnlikeDevicesFiveSgdStepsMatchOneDevice) {
  DATAPAR_REQUIRE_GPUS(1);
  expect_five_sgd_steps_match_one_gpu(gpu_and_cpus(1), at::kDouble, 1e-9);
  expect_five_sgd_steps_match_one_gpu(gpu_and_cpus(1), at::kFloat, 1e-5);
}

// Activation checkpointing on the GPU: the recomputation restores cuda:0's RNG state, so
// dropout on the GPU draws the same mask and the gradients are the plain segment's.
TEST(Gpu, ActivationCheckpointRestoresTheCudaRngForDropout) {
  DATAPAR_REQUIRE_GPUS(1);
  testing::turn_off_tf32();
  const auto gpu = at::TensorOptions(at::Device(at::kCUDA, 0));
  const at::Tensor w = at::randn({64, 64}, gpu).requires_grad_(true);
  const at::Tensor x = at::randn({32, 64}, gpu).requires_grad_(true);
  const auto segment = [&](const at::Tensor& in) { return at::dropout(at::matmul(in, w).relu(), 0.5, true); };
  std::vector<at::Tensor> grads[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    w.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
    torch::manual_seed(11);  // the CPU's and every CUDA device's generator
    const at::Tensor y = checkpointed ? checkpoint(segment, x) : segment(x);
    y.pow(2).sum().backward();
    grads[checkpointed] = {w.grad().clone(), x.grad().clone()};
  }
  EXPECT_TRUE(at::equal(grads[1][0], grads[0][0]));
  EXPECT_TRUE(at::equal(grads[1][1], grads[0][1]));
}

// FSDP on a GPU (one is enough): two ranks as threads over gloo, rank 0 on cuda:0 (CUDA
// tensors staged through host memory), each Linear a unit: the flat buffers' storage freed
// and refilled on the device, the all-gathers and reduce-scatters of CUDA tensors; 5 SGD
// steps with momentum on uneven batches equal one process on the CPU. Rank 1 runs on the
// CPU: two ranks that are threads of one process cannot share a GPU, because libtorch runs
// a device's backward functions on one engine thread, where one rank's gather for backward
// waits for the other's, queued behind it (real jobs' ranks are processes; the train CLI's
// test runs FSDP as two processes on cuda:0).
TEST(Gpu, FsdpOnCudaOverGlooEqualsOneProcess) {
  DATAPAR_REQUIRE_GPUS(1);
  testing::turn_off_tf32();
  const at::Device gpu0(at::kCUDA, 0);
  auto make = [] {
    torch::manual_seed(4);
    torch::nn::Sequential model(torch::nn::Linear(10, 20), torch::nn::ReLU(), torch::nn::Linear(20, 5));
    model->to(at::kDouble);
    return model;
  };
  auto batch = [](int r, int step) {
    return at::sin(at::arange(10 * (3 + r), at::kDouble).view({3 + r, 10}) * (0.1 * (r + 1)) + step);
  };
  torch::nn::Sequential reference = make();
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    reference_sgd.zero_grad();
    ((reference->forward(batch(0, step)).pow(2).mean() + reference->forward(batch(1, step)).pow(2).mean()) / 2)
        .backward();
    reference_sgd.step();
  }
  std::mutex make_one_at_a_time;  // the default generator is not thread-safe
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model;
    {
      const std::lock_guard<std::mutex> lock(make_one_at_a_time);
      model = make();
    }
    const at::Device device = rank == 0 ? gpu0 : at::Device(at::kCPU);
    model->to(device);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    torch::optim::SGD sgd(fsdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 5; ++step) {
      sgd.zero_grad();
      fsdp.forward(batch(rank, step).to(device)).pow(2).mean().backward();
      sgd.step();
    }
    for (const auto& item : fsdp.full_state_dict()) {
      EXPECT_EQ(item.value().device(), device) << item.key();
      EXPECT_TRUE(at::allclose(item.value().cpu(), reference->named_parameters()[item.key()], 1e-10, 1e-10))
          << "rank " << rank << ": " << item.key();
    }
  });
}

// --balance auto over cuda:0 and a CPU device: the CPU gets what it is worth, a few rows of
// every batch or, when its fixed cost per step (the replica's refresh, every layer's
// overhead) is longer than the GPU's whole step, none (docs/gpu.md: by seconds per row alone
// it kept a row and the step took 4x the GPU's); the gradient stays that of one device.
TEST(Gpu, UnlikeDevicesAutoBalanceGivesTheCpuItsMeasuredShare) {
  DATAPAR_REQUIRE_GPUS(1);
  const at::Device gpu0(at::kCUDA, 0);
  torch::manual_seed(3);
  ConvNet model;
  ConvNet reference = copy_to(model, gpu0);
  model->to(gpu0);
  DataParallelOptions options;
  options.devices = gpu_and_cpus(1);
  options.auto_balance = true;
  DataParallel dp(model, options);
  for (int step = 0; step < 16; ++step) {
    const at::Tensor x = at::randn({512, 1, 12, 12}, gpu0);
    const at::Tensor y = at::randint(0, 10, {512}, at::TensorOptions(gpu0).dtype(at::kLong));
    model->zero_grad();
    reference->zero_grad();
    at::cross_entropy_loss(dp(x), y).backward();
    at::cross_entropy_loss(reference(x), y).backward();
    const auto got = model->named_parameters();
    const auto want = reference->named_parameters();
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_LT(relative_error(got[j].value().grad(), want[j].value().grad()), 1e-5) << step << " " << got[j].key();
    }
  }
  const std::vector<int64_t> split = dp.last_chunk_sizes();
  ASSERT_EQ(split.size(), 2u);
  EXPECT_GT(split[0], 3 * split[1]) << split[0] << "/" << split[1];
  EXPECT_GE(dp.balancer()->rebalances(), 1);
}

// ---- One GPU: DDP of models on cuda:0 over gloo -----------------------------------------
// 2 and 3 ddp_probe processes share cuda:0; their gloo groups stage the CUDA buckets
// through pinned host memory (src/process_group/cuda_staging.cc). Each ends where one
// process training on the concatenated batches on the CPU ends: within 1e-4 relative and
// 1e-5 absolute in float32 (GPU against CPU kernels), 2e-2 and 2e-3 with a 16-bit hook.

// DATAPAR_SHM for the probes this test starts (the gloo group reads it).
class SharedMemory {
 public:
  explicit SharedMemory(bool on) { ::setenv("DATAPAR_SHM", on ? "1" : "0", 1); }
  ~SharedMemory() { ::unsetenv("DATAPAR_SHM"); }
};

TEST(Gpu, DdpOnCudaOverGlooSharedMemoryEqualsOneProcess) {
  DATAPAR_REQUIRE_GPUS(1);
  const SharedMemory shm(true);
  for (int world : {2, 3}) {
    testing::expect_matches_reference("even", world, 1e-4, 1e-5, "cuda:0");
    testing::expect_matches_reference("uneven", world, 1e-4, 1e-5, "cuda:0");  // average_by_samples
  }
}

TEST(Gpu, DdpOnCudaOverGlooTcpEqualsOneProcess) {
  DATAPAR_REQUIRE_GPUS(1);
  const SharedMemory tcp(false);
  testing::expect_matches_reference("even", 2, 1e-4, 1e-5, "cuda:0");
  testing::expect_matches_reference("uneven", 3, 1e-4, 1e-5, "cuda:0");
}

TEST(Gpu, DdpOnCudaOverGlooNoSyncJoinAndUnusedParameters) {
  DATAPAR_REQUIRE_GPUS(1);
  const std::string output = testing::expect_matches_reference("no_sync", 2, 1e-4, 1e-5, "cuda:0");
  EXPECT_NE(output.find("synchronised passes 5\n"), std::string::npos) << output;
  testing::expect_matches_reference("join", 3, 1e-4, 1e-5, "cuda:0");
  testing::expect_matches_reference("unused", 2, 1e-4, 1e-5, "cuda:0");
  testing::expect_matches_reference("bucket_view", 2, 1e-4, 1e-5, "cuda:0");
}

TEST(Gpu, DdpOnCudaOverGlooCompressionHooks) {
  DATAPAR_REQUIRE_GPUS(1);
  testing::expect_matches_reference("bf16", 2, 2e-2, 2e-3, "cuda:0");
  testing::expect_matches_reference("fp16", 2, 2e-2, 2e-3, "cuda:0");
}

TEST(Gpu, DdpOnCudaOverGlooSyncBatchNormAndZero) {
  DATAPAR_REQUIRE_GPUS(1);
  testing::expect_matches_reference("sync_bn", 2, 1e-4, 1e-5, "cuda:0");
  testing::expect_matches_reference("zero_adam", 2, 1e-4, 1e-5, "cuda:0");
}

// The last of 3 ranks on cuda:0 SIGKILLs itself in its second backward: the others' staged
// bucket all-reduce fails, and backward throws a datapar error naming rank 2, within the timeout.
TEST(Gpu, DdpOnCudaOverGlooAKilledRankFailsTheOthers) {
  DATAPAR_REQUIRE_GPUS(1);
  testing::TempDir dir("ddp_cuda_kill");
  bool timed_out = false;
  const auto start = std::chrono::steady_clock::now();
  const auto results = testing::run_ddp_job("kill", 3, dir, "cuda:0", 90s, &timed_out);
  EXPECT_FALSE(timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  EXPECT_EQ(results[2].signal, SIGKILL) << results[2].output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("Rank 2"), std::string::npos) << "the error names the dead rank:\n" << results[r].output;
  }
}

// SyncBatchNorm on float16 inputs on cuda:0 (2 ranks, threads of one gloo group): statistics
// and gradient sums in float32, a mean of 100 against a spread of 1 (issue 26: float16 sums of
// squares overflow, and E[x^2] - mean^2 loses the variance).
TEST(Gpu, SyncBatchNormOnFloat16) {
  DATAPAR_REQUIRE_GPUS(1);
  // Rank 0 on cuda:0, rank 1 on the CPU (sync_batch_norm_check.h says why not both on the GPU).
  testing::expect_matches_batch_norm_on_the_whole_batch(
      {at::kHalf, 100, 2e-2, {6, 10}, {at::Device(at::kCUDA, 0), at::Device(at::kCPU)}});
}

// `datapar train` on one GPU: DDP of 2 ranks sharing cuda:0 over gloo, DataParallel over
// cuda:0 and a CPU device balanced by measurement, and FSDP of 2 ranks on cuda:0 saving
// sharded checkpoints (dcp) that a second FSDP job resumes from; each trains and reports.
TEST(Gpu, TrainCliOnOneGpuDdpOverGlooAndUnlikeDevices) {
  DATAPAR_REQUIRE_GPUS(1);
  const testing::TempDir temp("train_one_gpu");
  const std::string datapar = DATAPAR_BIN_DIR "/datapar";
  const std::vector<std::vector<std::string>> runs{
      {datapar, "launch", "--nproc-per-node", "2", "--", datapar, "train", "--model", "mlp", "--epochs", "2", "--limit",
       "2000", "--batch-size", "64", "--lr", "0.05", "--momentum", "0.9", "--mode", "ddp", "--backend", "gloo"},
      {datapar, "train", "--model", "mlp", "--epochs", "2", "--limit", "2000", "--batch-size", "64", "--lr", "0.05",
       "--momentum", "0.9", "--mode", "dp", "--devices", "cuda:0,cpu:0", "--balance", "auto"},
      {datapar, "launch", "--nproc-per-node", "2", "--", datapar, "train", "--model", "mlp", "--epochs", "1", "--limit",
       "2000", "--batch-size", "64", "--lr", "0.05", "--momentum", "0.9", "--mode", "fsdp", "--backend", "gloo",
       "--checkpoint-dir", temp.path() + "/dcp", "--checkpoint-format", "dcp"},
      {datapar, "launch", "--nproc-per-node", "2", "--", datapar, "train", "--model", "mlp", "--epochs", "2", "--limit",
       "2000", "--batch-size", "64", "--lr", "0.05", "--momentum", "0.9", "--mode", "fsdp", "--backend", "gloo",
       "--checkpoint-dir", temp.path() + "/dcp", "--checkpoint-format", "dcp", "--resume"},
  };
  for (const auto& run : runs) {
    const auto results = testing::run_processes({run}, temp.path(), 300s);
    EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
    EXPECT_NE(results[0].output.find("test acc"), std::string::npos) << results[0].output;
    if (run.back() == "--resume") {
      EXPECT_NE(results[0].output.find("resuming from"), std::string::npos) << results[0].output;
    }
  }
}

// Issue 50: a whole SGD step (forward, backward, update) captured in a CUDA graph and
// replayed 200 times trains as the same steps run eagerly: every step's loss equal within
// 1e-6 relative, and the final parameters.
TEST(Gpu, CudaGraphStepTrainsAsEagerStepsOnOneGpu) {
  DATAPAR_REQUIRE_GPUS(1);
  const at::Device gpu0(at::kCUDA, 0);
  const auto make = [&] {
    torch::manual_seed(5);
    torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
    net->to(gpu0);
    return net;
  };
  torch::nn::Sequential eager = make(), graphed = make();
  torch::optim::SGD eager_sgd(eager->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD graphed_sgd(graphed->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  train::CudaGraphStep step(graphed_sgd, [&](const std::vector<at::Tensor>& in) {
    const at::Tensor loss = at::cross_entropy_loss(graphed->forward(in[0]), in[1]);
    loss.backward();
    graphed_sgd.step();
    return std::vector<at::Tensor>{loss.detach()};
  });
  at::Generator g = at::detail::createCPUGenerator(9);
  for (int i = 0; i < 200; ++i) {
    const at::Tensor x = at::randn({32, 64}, g).to(gpu0), y = at::randint(10, {32}, g).to(gpu0);
    eager_sgd.zero_grad();
    const at::Tensor eager_loss = at::cross_entropy_loss(eager->forward(x), y);
    eager_loss.backward();
    eager_sgd.step();
    const at::Tensor graphed_loss = step({x, y}).at(0).clone();
    ASSERT_LT(relative_error(graphed_loss, eager_loss.detach()), 1e-6) << "step " << i;
  }
  EXPECT_TRUE(step.captured());
  EXPECT_EQ(step.replays(), 197);  // 3 warm-up steps, then the capture's first replay and 196 more
  for (size_t i = 0; i < eager->parameters().size(); ++i) {
    EXPECT_LT(relative_error(graphed->parameters()[i], eager->parameters()[i]), 1e-6) << "parameter " << i;
  }
  EXPECT_THROW(step({at::zeros({16, 64}, gpu0), at::zeros({16}, at::TensorOptions(gpu0).dtype(at::kLong))}),
               InvalidArgumentError)
      << "a batch of another shape than the captured one";
}

// The CLI under --cuda-graph on one GPU, single and DDP over NCCL at world size 1, against the
// same runs without it (2048 samples in batches of 64: no partial batch to leave out): the
// same epoch lines, to the digit. And --amp bf16 and fp16 on the GPU within a point of float32.
TEST(Gpu, TrainCliCudaGraphAndAmpOnOneGpu) {
  DATAPAR_REQUIRE_GPUS(1);
  const testing::TempDir temp("train_cuda_graph");
  const std::string datapar = DATAPAR_BIN_DIR "/datapar";
  const std::vector<std::string> train{"train", "--model", "mlp", "--epochs", "3", "--limit", "2048",
                                       "--batch-size", "64", "--lr", "0.05", "--momentum", "0.9", "--seed", "4"};
  const auto run = [&](std::vector<std::string> prefix, const std::vector<std::string>& more) {
    prefix.insert(prefix.end(), train.begin(), train.end());
    prefix.insert(prefix.end(), more.begin(), more.end());
    const auto results = testing::run_processes({prefix}, temp.path(), 300s);
    EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
    return results[0].output;
  };
  // "epoch N/3  loss L  train acc A  test acc T": the numbers, without the times.
  const auto epochs = [](const std::string& output) {
    std::string lines;
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("epoch ", 0) == 0) lines += line.substr(0, line.find(" test acc ") + 16) + "\n";
    }
    return lines;
  };
  const std::vector<std::string> single{datapar};
  const std::vector<std::string> ddp{datapar, "launch", "--nproc-per-node", "1", "--", datapar};
  for (const auto& [launcher, mode] : {std::pair{single, std::vector<std::string>{"--devices", "cuda:0"}},
                                       std::pair{ddp, std::vector<std::string>{"--mode", "ddp", "--backend", "nccl"}}}) {
    const std::string eager = run(launcher, mode);
    std::vector<std::string> graphed_flags = mode;
    graphed_flags.push_back("--cuda-graph");
    const std::string graphed = run(launcher, graphed_flags);
    EXPECT_FALSE(epochs(eager).empty()) << eager;
    EXPECT_EQ(epochs(graphed), epochs(eager)) << graphed << "\nwithout --cuda-graph:\n" << eager;
  }
  const auto accuracy = [](const std::string& output) {
    const size_t at = output.rfind("test acc ");
    return at == std::string::npos ? -1.0 : std::stod(output.substr(at + 9));
  };
  const double fp32 = accuracy(run(single, {"--devices", "cuda:0"}));
  for (const std::string amp : {"bf16", "fp16"}) {
    EXPECT_NEAR(accuracy(run(single, {"--devices", "cuda:0", "--amp", amp})), fp32, 0.01) << amp;
  }
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

// The backend conformance suite (testing/conformance.h) and more, on two ranks.
TEST(Gpu, NcclPassesTheConformanceSuite) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("collectives", 2, 120s));
}

TEST(Gpu, DdpOnNcclEqualsSingleProcessTraining) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("ddp", 2, 180s));
}

// FSDP on NCCL, a GPU per rank: each rank keeps half of every unit (tests/gpu/nccl_probe.cc).
TEST(Gpu, FsdpOnNcclEqualsSingleProcessTraining) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("fsdp", 2, 180s));
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

// ONE GPU: NCCL with world size 1, every path a single GPU can show (nccl_groups.cc),
// and DDP, its metadata, ZeRO and the collectives' closed forms at world size 1.
TEST(Gpu, NcclWorldOneEveryPath) {
  DATAPAR_REQUIRE_GPUS(1);
  const auto results = run_nccl_job("world1", 1, 240s);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
}

TEST(Gpu, NcclWorldOneCollectivesDdpFsdpMetadataAndZero) {
  DATAPAR_REQUIRE_GPUS(1);
  for (const std::string scenario : {"collectives", "ddp", "fsdp", "metadata", "zero_trace"}) {
    SCOPED_TRACE(scenario);
    expect_all_passed(run_nccl_job(scenario, 1, 180s));
  }
}

// A collective that times out after its wait() returned (the stream ran on with partial
// results) ends the process with the error, unless the program opted to handle it; then the
// next synchronize() and call throw (issue 26, NcclOptions::end_process_on_failure).
TEST(Gpu, NcclFailureAfterWaitEndsTheProcessUnlessHandled) {
  DATAPAR_REQUIRE_GPUS(1);
  const auto ended = run_nccl_job("fail_after_wait", 1, 60s);
  EXPECT_EQ(ended[0].exit_code, 1) << ended[0].output;
  const std::string& out = ended[0].output;
  EXPECT_NE(out.find("wait() returned"), std::string::npos) << out;
  EXPECT_NE(out.find("datapar: ending the process: all_reduce(sum) on rank 0 of 1 (nccl)"), std::string::npos) << out;
  EXPECT_NE(out.find("timeout"), std::string::npos) << out;
  EXPECT_EQ(out.find("did not end"), std::string::npos) << out;

  const auto handled = run_nccl_job("fail_after_wait_handled", 1, 60s);
  EXPECT_EQ(handled[0].exit_code, 0) << handled[0].output;
  EXPECT_EQ(handled[0].output.find("datapar: ending the process"), std::string::npos) << handled[0].output;
}

// --balance auto on NCCL (issue 26): rank 1 computes slower and the others wait for it in
// backward, on their streams (nccl's wait() does not block the host). The wait is timed by
// CUDA events, so the waiting ranks are measured fast and rank 1 gets the smallest share.
TEST(Gpu, BalanceOnNcclGivesASlowedRankASmallerShare) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("balance", 2, 120s));
}

// Two nccl groups made on one store, one after the other, each its own NCCL communicator
// (issue 26: they shared the store's "nccl/id" and check-in count).
TEST(Gpu, TwoNcclGroupsOnOneStore) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("two_groups", 2, 180s));
}

// Every public factory's group inspects its stalls (issue 45: they are assembled one way).
TEST(Gpu, ANcclGroupFromItsFactoryWarnsOnAStall) {
  DATAPAR_REQUIRE_GPUS(2);
  expect_all_passed(run_nccl_job("stall", 2, 120s));
}

TEST(Gpu, AKilledRankIsACommErrorWithinTheTimeout) {
  DATAPAR_REQUIRE_GPUS(2);
  const auto start = std::chrono::steady_clock::now();
  const auto results = run_nccl_job("kill", 2, 120s);
  // Rank 1 SIGKILLs itself; rank 0 must fail its all_reduce with CommError (exit 0 means it
  // did) within the group's timeout (20 s) and the watchdog's reaction, well before the
  // probe's own deadline of three timeouts.
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 50s);
}

}  // namespace
}  // namespace datapar
