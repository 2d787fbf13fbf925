// DistributedDataParallel against one-process training, with real processes over loopback
// (ddp_probe workers on the Gloo backend).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdlib>
#include <regex>

#include "datapar/state_dict.h"
#include "datapar/train/checkpoint.h"
#include "datapar/optim/optimizer_state.h"
#include "ddp/bucket_assignment.h"
#include "testing/ddp_jobs.h"
#include "testing/ddp_scenarios.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"
#include "testing/processes.h"
#include "testing/python.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

using testing::expect_matches_reference;

std::vector<testing::ProcessResult> ddp_job(const std::string& scenario, int world, const testing::TempDir& dir,
                                            std::chrono::seconds deadline = 120s, bool* timed_out = nullptr) {
  return testing::run_ddp_job(scenario, world, dir, "cpu", deadline, timed_out);
}

TEST(DistributedDataParallel, FiveStepsEqualOneProcessOnTheConcatenatedBatch) {
  for (int world : {2, 3}) expect_matches_reference("even", world, 1e-5, 1e-6);
}

// PyTorch's own DDP (tests/ddp/torch_ddp_twin.py, gloo, 2 processes) on the same model,
// initialisation, batches and optimizer ends where datapar's DDP ends.
TEST(DistributedDataParallel, EndsWherePyTorchsDdpEnds) {
  DATAPAR_REQUIRE_PYTHON_TORCH();
  for (const std::string name : {"even", "one_bucket"}) {
    testing::TempDir dir("ddp");
    const auto results = ddp_job(name, 2, dir);
    for (int r = 0; r < 2; ++r) ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    const std::string theirs = dir.path() + "/pytorch.pt";
    ASSERT_EQ(testing::run_python_file(DATAPAR_SOURCE_DIR "/tests/ddp/torch_ddp_twin.py", name + " " + theirs), 0);
    const StateDict want = load_state_dict_file(theirs);
    for (int r = 0; r < 2; ++r) {
      const StateDict got = load_state_dict_file(dir.path() + "/rank" + std::to_string(r) + ".pt");
      ASSERT_EQ(got.size(), want.size());
      for (const auto& item : want) {
        EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-5, 1e-6))
            << name << ", rank " << r << ", " << item.key() << ": max difference "
            << (got[item.key()] - item.value()).abs().max().item<double>();
      }
    }
  }
}

TEST(DistributedDataParallel, UnevenBatchesAveragedBySamplesAreExact) {
  for (int world : {2, 3}) expect_matches_reference("uneven", world, 1e-5, 1e-6);
}

TEST(DistributedDataParallel, NoSyncAccumulatesMicroBatches) {
  const std::string output = expect_matches_reference("no_sync", 2, 1e-5, 1e-6);
  // Two backward passes per step, only the second synchronised.
  const testing::DdpScenario s = testing::scenario("no_sync", 2);
  EXPECT_NE(output.find("synchronised passes " + std::to_string(s.rows.size()) + "\n"), std::string::npos) << output;
}

TEST(DistributedDataParallel, AParameterUnusedOnOneRank) { expect_matches_reference("unused", 2, 1e-5, 1e-6); }

// Issue 26: a synchronised step reads nothing back on the host (on a GPU, it would wait for
// the device) unless find_unused_parameters must learn which parameters were used: averaging
// by samples (the counts), and join (the roll call of every forward) included. Counted by
// the metadata layer (detail::metadata_host_reads) in each rank's steps from the third.
TEST(DistributedDataParallel, AStepReadsNothingBackOnTheHost) {
  struct Case {
    std::string scenario;
    int world;
    std::vector<int> ranks;  // those with 3 steps or more
    int reads;               // from step 3 on, per rank
  };
  for (const Case& c : {Case{"uneven", 2, {0, 1}, 0}, Case{"even", 2, {0, 1}, 0}, Case{"join", 3, {1, 2}, 0},
                        Case{"unused", 2, {0, 1}, 3}}) {  // unused: one read per step, steps 3 to 5
    testing::TempDir dir("ddp_host_reads");
    const auto results = ddp_job(c.scenario, c.world, dir);
    for (int r : c.ranks) {
      ASSERT_EQ(results[r].exit_code, 0) << c.scenario << ", rank " << r << ":\n" << results[r].output;
      EXPECT_NE(results[r].output.find("host reads from step 3: " + std::to_string(c.reads) + "\n"), std::string::npos)
          << c.scenario << ", rank " << r << ":\n" << results[r].output;
    }
  }
}

// Issue 26: a channels_last convolution's gradient keeps the parameter's layout through the
// buckets (Note [Bucket views follow the parameters' strides] in reducer.cc); as a bucket
// view it is the bucket's memory, channels_last too, step after step. Both ranks train on
// the same batch, so the averaged gradient is the local one.
TEST(DistributedDataParallel, GradientsKeepAChannelsLastLayout) {
  for (const bool as_view : {false, true}) {
    SCOPED_TRACE(as_view ? "gradient_as_bucket_view" : "gradients copied");
    testing::run_gloo_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(3);  // the ranks are threads: not the global one
      torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3));
      conv->weight.set_data(at::randn({8, 3, 3, 3}, gen).contiguous(at::MemoryFormat::ChannelsLast));
      conv->bias.set_data(at::randn({8}, gen));
      const at::Tensor x = at::randn({4, 3, 6, 6}, gen).contiguous(at::MemoryFormat::ChannelsLast);
      conv(x).square().sum().backward();
      const at::Tensor local = conv->weight.grad().clone();
      conv->weight.mutable_grad() = at::Tensor();
      DdpOptions options;
      options.gradient_as_bucket_view = as_view;
      DistributedDataParallel<torch::nn::Conv2dImpl> ddp(conv, group, options);
      const void* first = nullptr;
      for (int step = 0; step < 3; ++step) {
        if (conv->weight.grad().defined()) conv->weight.mutable_grad().zero_();
        ddp.forward(x).square().sum().backward();
        const at::Tensor& grad = conv->weight.grad();
        EXPECT_TRUE(grad.is_contiguous(at::MemoryFormat::ChannelsLast)) << "step " << step << ": " << grad.strides();
        EXPECT_TRUE(at::allclose(grad, local, 1e-5, 1e-6)) << "step " << step;
        // The buckets are rebuilt once, at the second forward; from then on the same memory.
        if (as_view && step == 1) first = grad.data_ptr();
        if (as_view && step == 2) EXPECT_EQ(grad.data_ptr(), first) << "the gradient is no longer the bucket";
      }
    });
  }
}

TEST(DistributedDataParallel, GradientsAsBucketViewsAndOneBigBucket) {
  expect_matches_reference("bucket_view", 2, 1e-5, 1e-6);
  expect_matches_reference("one_bucket", 3, 1e-5, 1e-6);
}

TEST(DistributedDataParallel, Bf16CompressionHookStaysClose) { expect_matches_reference("bf16", 2, 2e-2, 2e-3); }

// fp16 on the wire, a global batch of 8192 averaged by samples, gradients of about ten:
// each rank sends its share of the gradient, so nothing overflows float16's 65504 (issue 26;
// sending n_r times the gradient made the sum inf and the parameters NaN).
TEST(DistributedDataParallel, Fp16CompressionHookAtAGlobalBatchOf8192) {
  expect_matches_reference("fp16_8192", 2, 2e-2, 2e-3);
}

TEST(DistributedDataParallel, JoinLetsARankWithOneBatchFinishBesideOneWithThree) {
  expect_matches_reference("join", 2, 1e-5, 1e-6);
}

TEST(DistributedDataParallel, SyncBatchNormUsesTheStatisticsOfEveryRank) {
  for (int world : {2, 3}) expect_matches_reference("sync_bn", world, 1e-5, 1e-6);
}

TEST(SyncBatchNorm, WithoutAGroupIsBatchNormAndConversionRefusesTorchBatchNorm) {
  torch::manual_seed(3);
  SyncBatchNorm sync(4);
  torch::nn::BatchNorm2d plain(4);
  const at::Tensor x = at::randn({6, 4, 3, 3});
  EXPECT_TRUE(at::allclose(sync->forward(x), plain->forward(x), 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(sync->running_var, plain->running_var, 1e-6, 1e-6));
  EXPECT_EQ(state_dict(*sync).keys(), state_dict(*plain).keys());
  torch::nn::Sequential with_torch_bn(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3));
  EXPECT_THROW_MSG(convert_sync_batchnorm(*with_torch_bn, std::shared_ptr<ProcessGroup>(nullptr)), InvalidArgumentError,
                   "1 are torch::nn::BatchNorm modules");
}

TEST(DistributedDataParallel, MismatchedModelsFailOnEveryRankNamingTheDifference) {
  testing::TempDir dir("ddp");
  const auto results = ddp_job("mismatch", 3, dir, 60s);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
}

TEST(DistributedDataParallel, ARankKilledMidBackwardFailsTheOthers) {
  testing::TempDir dir("ddp");
  bool timed_out = false;
  const auto start = std::chrono::steady_clock::now();
  const auto results = ddp_job("kill", 3, dir, 60s, &timed_out);
  EXPECT_FALSE(timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 40s);
  EXPECT_EQ(results[2].signal, SIGKILL) << results[2].output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("Rank 2"), std::string::npos) << "the error names the dead rank:\n" << results[r].output;
  }
}

// Rank 0 evaluates through the wrapper without grad, alone: no collective, so no hang, and
// the ranks go on training in step (issue 26; PyTorch broadcasts buffers in training only).
TEST(DistributedDataParallel, EvaluationOnOneRankAloneDoesNotHang) {
  testing::TempDir dir("ddp");
  bool timed_out = false;
  const auto results = ddp_job("eval_on_rank0", 2, dir, 60s, &timed_out);
  EXPECT_FALSE(timed_out);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
}

TEST(DistributedDataParallel, AStalledBucketWarnsNamingIt) {
  testing::TempDir dir("ddp");
  const auto results = ddp_job("stall", 2, dir, 60s);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
  // The group's stall inspector reports the bucket's all-reduce (Note [Stall inspection]).
  std::smatch stall;
  ASSERT_TRUE(std::regex_search(results[0].output, stall,
                                std::regex(R"(warning: all_reduce\((sum|avg)\) on rank 0 of 2 \([^)]*\), collective (\d+) of )"
                                           R"(this group, has not completed after \d+ s: rank\(s\) 1 \(at (\d+)\) have )"
                                           R"(not issued it yet)")))
      << results[0].output;
  EXPECT_EQ(std::stoi(stall[3]), std::stoi(stall[2]) - 1) << results[0].output;
  EXPECT_EQ(results[1].output.find("warning"), std::string::npos) << results[1].output;
  // Rank 0 waited for rank 1's 3 s nap after its own last gradient: communication that
  // backward could not hide, and communication_stats() says so.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(results[0].output, m, std::regex(R"(synchronised passes (\d+), exposed wait (\d+) ms)")))
      << results[0].output;
  EXPECT_EQ(std::stoi(m[1]), 3);
  EXPECT_GE(std::stoi(m[2]), 2500) << results[0].output;
}

// "state bytes N" from a zero_* probe's output.
int64_t state_bytes(const std::string& output) {
  std::smatch m;
  const std::regex re(R"(state bytes (\d+))");
  return std::regex_search(output, m, re) ? std::stoll(m[1].str()) : -1;
}

// ZeRO-1 under DDP: every rank updates only the parameters it owns, holding only their
// optimizer state, and the job ends where one process with the whole optimizer ends; the
// state consolidated on rank 0 is that process's optimizer state, in a checkpoint.
TEST(ZeroRedundancyOptimizer, ShardedStepsEqualUnshardedTrainingAndConsolidateToItsState) {
  for (const std::string optimizer : {"sgd", "adam", "adamw"}) {
    for (int world : {2, 3}) {
      const std::string name = "zero_" + optimizer;
      testing::TempDir dir("zero");
      const auto results = ddp_job(name, world, dir);
      for (int r = 0; r < world; ++r) ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
      const testing::DdpScenario s = testing::scenario(name, world);
      std::unique_ptr<torch::optim::Optimizer> reference_optimizer;
      const auto reference = testing::train_reference<testing::ProbeNet>(s, &reference_optimizer);
      for (int r = 0; r < world; ++r) {
        const StateDict got = load_state_dict_file(dir.path() + "/rank" + std::to_string(r) + ".pt");
        for (const auto& item : state_dict(*reference)) {
          EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-5, 1e-6))
              << name << ", world " << world << ", rank " << r << ", " << item.key() << ": max difference "
              << (got[item.key()] - item.value()).abs().max().item<double>();
        }
      }
      // The consolidated state: the reference optimizer's, parameter by parameter.
      const train::Checkpoint c = train::load_checkpoint(dir.path() + "/zero.ckpt");
      const OptimizerState want = optimizer_state_dict(*reference_optimizer);
      const auto got_state = c.optimizer.at("state").toGenericDict(), want_state = want.at("state").toGenericDict();
      ASSERT_EQ(got_state.size(), want_state.size()) << name << ", world " << world;
      int64_t full_bytes = 0;
      for (const auto& entry : want_state) {
        const auto mine = got_state.at(entry.key()).toGenericDict();
        for (const auto& field : entry.value().toGenericDict()) {
          const c10::IValue& theirs = mine.at(field.key());
          if (field.value().isTensor() && field.value().toTensor().dim() > 0) {
            full_bytes += static_cast<int64_t>(field.value().toTensor().nbytes());
            EXPECT_TRUE(at::allclose(theirs.toTensor(), field.value().toTensor(), 1e-5, 1e-6))
                << name << ", world " << world << ", state of parameter " << entry.key() << ", "
                << field.key().toStringRef();
          } else if (field.value().isTensor()) {  // Adam's step, a 0-dim tensor in PyTorch's layout
            EXPECT_EQ(theirs.toTensor().item<double>(), field.value().toTensor().item<double>());
          }
        }
      }
      // Each rank holds only its shard: together exactly the whole state, once.
      int64_t sum = 0;
      for (int r = 0; r < world; ++r) {
        const int64_t bytes = state_bytes(results[r].output);
        EXPECT_GT(bytes, 0) << results[r].output;
        EXPECT_LT(bytes, full_bytes) << "rank " << r;
        sum += bytes;
      }
      EXPECT_EQ(sum, full_bytes) << name << ", world " << world;
    }
  }
}

// From the consolidated checkpoint after 3 of 5 steps, sharded again or with an ordinary
// optimizer: the same bits as 5 steps straight.
TEST(ZeroRedundancyOptimizer, ACheckpointResumesBitForBitWithOrWithoutSharding) {
  for (const std::string optimizer : {"sgd", "adam"}) {
    auto final_parameters = [&](const std::string& name) {
      const testing::TempDir dir("zero");
      const auto results = ddp_job(name, 2, dir);
      for (int r = 0; r < 2; ++r) EXPECT_EQ(results[r].exit_code, 0) << name << " rank " << r << ":\n" << results[r].output;
      return load_state_dict_file(dir.path() + "/rank1.pt");
    };
    const StateDict straight = final_parameters("zero_" + optimizer);
    for (const std::string resume : {"_resume", "_resume_plain"}) {
      const StateDict resumed = final_parameters("zero_" + optimizer + resume);
      ASSERT_EQ(resumed.size(), straight.size());
      for (const auto& item : straight) {
        EXPECT_TRUE(at::equal(resumed[item.key()], item.value()))
            << optimizer << resume << ", " << item.key() << ": max difference "
            << (resumed[item.key()] - item.value()).abs().max().item<double>();
      }
    }
  }
}

TEST(BucketAssignment, ReverseOrderWithASmallFirstBucketAndDtypesApart) {
  std::vector<at::Tensor> params = {at::zeros({100}), at::zeros({100}), at::zeros({300}), at::zeros({10}, at::kDouble),
                                    at::zeros({200})};
  // Caps: first 400 bytes (100 floats), then 1200 bytes (300 floats).
  const auto buckets = detail::assign_buckets(params, detail::reverse_order(5), 400, 1200);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0], (detail::BucketIndices{4}));     // 800 bytes >= the first cap
  EXPECT_EQ(buckets[1], (detail::BucketIndices{3}));     // the double, alone
  EXPECT_EQ(buckets[2], (detail::BucketIndices{2}));     // 1200 bytes: full
  EXPECT_EQ(buckets[3], (detail::BucketIndices{1, 0}));  // what is left
}

}  // namespace
}  // namespace datapar
