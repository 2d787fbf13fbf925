#include "datapar/parallel/data_parallel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <chrono>
#include <optional>
#include <set>
#include <thread>

#include "datapar/amp/autocast.h"
#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/models.h"

namespace datapar {
namespace {

using testing::BnNet;
using testing::ConvNet;
using testing::relative_error;

// Gradients of DataParallel on k devices against one device on the whole batch.
void expect_same_gradients(const std::vector<Device>& devices, std::vector<double> weights = {}) {
  torch::manual_seed(7);
  ConvNet model;
  ConvNet reference = copy_of(model);
  DataParallel dp(model, DataParallelOptions{devices, std::nullopt, 0, std::move(weights)});

  const auto x = at::randn({30, 1, 12, 12});
  const auto target = at::randint(0, 10, {30});
  const auto x_dp = x.clone().requires_grad_();
  at::cross_entropy_loss(dp(x_dp), target).backward();
  const auto x_ref = x.clone().requires_grad_();
  at::cross_entropy_loss(reference(x_ref), target).backward();

  const auto got = model->named_parameters();
  const auto want = reference->named_parameters();
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_TRUE(got[j].value().grad().defined()) << got[j].key();
    EXPECT_LT(relative_error(got[j].value().grad(), want[j].value().grad()), 1e-5)
        << got[j].key() << " on " << to_string(devices);
  }
  EXPECT_LT(relative_error(x_dp.grad(), x_ref.grad()), 1e-5);
}

TEST(DataParallel, GradientsEqualOneDeviceOnTheFullBatch) {
  expect_same_gradients(cpu_devices(2));
  expect_same_gradients(cpu_devices(3));
  expect_same_gradients(cpu_devices(4));
}

TEST(DataParallel, UnevenSplitsGiveTheSameGradients) {
  expect_same_gradients(cpu_devices(2), {1, 3});
  expect_same_gradients(cpu_devices(4), {0.5, 1, 1, 1});
}

TEST(DataParallel, FiveSgdStepsMatchOneDevice) {
  torch::manual_seed(3);
  ConvNet model;
  ConvNet reference = copy_of(model);
  DataParallel dp(model, cpu_devices(3));
  torch::optim::SGD sgd(dp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD sgd_ref(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    const auto x = at::randn({25, 1, 12, 12});
    const auto y = at::randint(0, 10, {25});
    sgd.zero_grad();
    at::cross_entropy_loss(dp(x), y).backward();
    sgd.step();
    sgd_ref.zero_grad();
    at::cross_entropy_loss(reference(x), y).backward();
    sgd_ref.step();
  }
  const auto got = model->parameters();
  const auto want = reference->parameters();
  for (size_t j = 0; j < got.size(); ++j) EXPECT_LT(relative_error(got[j], want[j]), 1e-5);
}

TEST(DataParallel, TutorialChunkSizes) {
  auto model = torch::nn::Linear(5, 2);
  struct Case {
    int devices;
    int64_t batch;
    std::vector<int64_t> rows;
  };
  for (const Case& c : std::vector<Case>{{4, 30, {8, 8, 8, 6}}, {4, 10, {3, 3, 3, 1}}, {2, 30, {15, 15}},
                                         {2, 10, {5, 5}}, {3, 30, {10, 10, 10}}, {4, 25, {7, 7, 7, 4}},
                                         {4, 2, {1, 1}}}) {
    DataParallel dp(model, cpu_devices(c.devices));
    const auto out = dp(at::randn({c.batch, 5}));
    EXPECT_EQ(out.sizes(), at::IntArrayRef({c.batch, 2}));
    EXPECT_EQ(dp.last_chunk_sizes(), c.rows) << c.batch << " rows on " << c.devices << " devices";
  }
}

TEST(DataParallel, BackwardRunsOnTheDeviceThreadsSideBySide) {
  auto log = std::make_shared<testing::ThreadLog>();
  testing::ThreadProbe model(log);
  DataParallel dp(model, cpu_devices(3));
  dp(at::randn({9, 5})).sum().backward();
  EXPECT_EQ(log->backward_threads.size(), 3u);
  EXPECT_EQ(log->backward_threads.count(std::this_thread::get_id()), 0u);
  EXPECT_TRUE(model->fc->weight.grad().defined());
}

TEST(DataParallel, BatchNormUsesPerReplicaStatisticsAndTheFirstReplicasRunningStats) {
  torch::manual_seed(1);
  BnNet model;
  BnNet reference;
  load_state_dict(*reference, state_dict(*model));
  DataParallel dp(model, cpu_devices(2));
  const auto x = at::randn({12, 6}) * 3 + 1;
  const auto out = dp(x);
  // Each half is normalised by its own batch statistics...
  const auto first = reference(x.narrow(0, 0, 6));
  EXPECT_LT(relative_error(out.narrow(0, 0, 6), first), 1e-5);
  // ...and the running statistics are those of the first half only.
  EXPECT_LT(relative_error(model->bn->running_mean, reference->bn->running_mean), 1e-6);
  EXPECT_LT(relative_error(model->bn->running_var, reference->bn->running_var), 1e-6);
  EXPECT_EQ(model->bn->num_batches_tracked.item<int64_t>(), 1);
}

TEST(DataParallel, SeveralArgumentsAndTupleOutputs) {
  testing::TwoHeads model;
  DataParallel dp(model, cpu_devices(2));
  const auto x = at::randn({7, 4});
  const auto y = at::randn({7, 3});
  auto [p, q] = dp(x, y, 2.0);
  auto [p_ref, q_ref] = model->forward(x, y, 2.0);
  EXPECT_LT(relative_error(p, p_ref), 1e-6);
  EXPECT_LT(relative_error(q, q_ref), 1e-6);
  (p.sum() + q.sum()).backward();
  EXPECT_TRUE(model->a->weight.grad().defined());
  EXPECT_TRUE(model->b->weight.grad().defined());
  EXPECT_FALSE(model->unused->weight.grad().defined());  // no gradient, as on one device
}

TEST(DataParallel, ReplicaFailureIsRethrownNamingTheDevice) {
  testing::TwoHeads model(/*min_rows=*/2);
  DataParallel dp(model, cpu_devices(4));
  EXPECT_THROW_MSG(dp(at::randn({10, 4}), at::randn({10, 3}), 1.0), Error,
                   "replica on cpu:3 failed: chunk too small: 1 rows");
  // The wrapper still works afterwards.
  EXPECT_NO_THROW(dp(at::randn({12, 4}), at::randn({12, 3}), 1.0));
}

TEST(DataParallel, OneDeviceCallsTheModuleDirectly) {
  auto log = std::make_shared<testing::ThreadLog>();
  testing::ThreadProbe model(log);
  DataParallel dp(model, cpu_devices(1));
  dp(at::randn({4, 5})).sum().backward();
  EXPECT_EQ(log->backward_threads.count(std::this_thread::get_id()), 1u);
  EXPECT_EQ(dp.last_chunk_sizes(), std::vector<int64_t>{4});
}

TEST(DataParallel, RetainGraphAllowsASecondBackward) {
  ConvNet model;
  DataParallel dp(model, cpu_devices(2));
  const auto loss = dp(at::randn({6, 1, 12, 12})).pow(2).sum();
  loss.backward({}, /*retain_graph=*/true);
  const auto once = model->parameters()[0].grad().clone();
  loss.backward();
  EXPECT_LT(relative_error(model->parameters()[0].grad(), once * 2), 1e-5);
  EXPECT_THROW(loss.backward(), c10::Error);  // the graph is gone now
}

TEST(DataParallel, FrozenParametersGetNoGradient) {
  ConvNet model;
  model->net[0]->as<torch::nn::Conv2d>()->weight.requires_grad_(false);
  DataParallel dp(model, cpu_devices(2));
  dp(at::randn({6, 1, 12, 12})).sum().backward();
  EXPECT_FALSE(model->net[0]->as<torch::nn::Conv2d>()->weight.grad().defined());
  EXPECT_TRUE(model->net[0]->as<torch::nn::Conv2d>()->bias.grad().defined());
}

TEST(DataParallel, NoGradForwardBuildsNoGraph) {
  ConvNet model;
  DataParallel dp(model, cpu_devices(2));
  at::NoGradGuard no_grad;
  EXPECT_FALSE(dp(at::randn({6, 1, 12, 12})).requires_grad());
}

// torch.autocast's scope as Python has it (datapar/amp/autocast.h): on inside, restored after
// (nested scopes too), the forward's linear layers in bfloat16 on every device thread of a
// DataParallel, the parameters and their gradients float32.
TEST(DataParallel, AutocastReachesTheDeviceThreadsAndEndsWithItsScope) {
  torch::nn::Linear model(8, 4);
  DataParallel dp(model, cpu_devices(2));
  at::Tensor y;
  EXPECT_FALSE(amp::Autocast::enabled(c10::DeviceType::CPU));
  {
    const amp::Autocast autocast(c10::DeviceType::CPU, at::kBFloat16);
    {
      const amp::Autocast inner(c10::DeviceType::CPU, at::kBFloat16);
      EXPECT_TRUE(amp::Autocast::enabled(c10::DeviceType::CPU));
    }
    EXPECT_TRUE(amp::Autocast::enabled(c10::DeviceType::CPU)) << "the outer scope still holds";
    y = dp(at::randn({6, 8}));
    EXPECT_EQ(at::mm(at::randn({2, 2}), at::randn({2, 2})).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(amp::Autocast::enabled(c10::DeviceType::CPU));
  EXPECT_EQ(at::mm(at::randn({2, 2}), at::randn({2, 2})).scalar_type(), at::kFloat);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16) << "each replica's linear layer ran under autocast";
  y.to(at::kFloat).sum().backward();
  EXPECT_EQ(model->weight.grad().scalar_type(), at::kFloat);
  EXPECT_THROW_MSG(amp::Autocast(c10::DeviceType::CPU, at::kFloat), InvalidArgumentError,
                   "Autocast computes in bfloat16 or float16, not Float");
}

TEST(DataParallel, NamesHaveNoModulePrefixAndStateMovesBothWays) {
  ConvNet model;
  DataParallel dp(model, cpu_devices(2));
  const auto bare_names = model->named_parameters().keys();
  EXPECT_EQ(dp.named_parameters().keys(), bare_names);
  EXPECT_EQ(dp.state_dict().keys(), state_dict(*model).keys());
  EXPECT_EQ(dp.state_dict().keys().front(), "net.0.weight");

  // Wrapper -> bare module.
  ConvNet bare;
  load_state_dict(*bare, dp.state_dict());
  EXPECT_TRUE(at::equal(bare->parameters()[0], model->parameters()[0]));
  // Bare module -> wrapper.
  ConvNet source;
  dp.load_state_dict(state_dict(*source));
  EXPECT_TRUE(at::equal(model->parameters()[0], source->parameters()[0]));
  // And through a file, both ways.
  const std::string path = ::testing::TempDir() + "/dp_state.pt";
  save_state_dict(dp.state_dict(), path);
  ConvNet loaded;
  load_state_dict(*loaded, load_state_dict_file(path));
  EXPECT_TRUE(at::equal(loaded->parameters()[0], source->parameters()[0]));
  save_state_dict(state_dict(*bare), path);
  dp.load_state_dict(load_state_dict_file(path));
  EXPECT_TRUE(at::equal(model->parameters()[0], bare->parameters()[0]));
}

// A parameter that reaches the output only through view(): its replica gradients are views
// of the incoming gradient, which the sum must not write into.
class ViewOutputImpl : public torch::nn::Cloneable<ViewOutputImpl> {
 public:
  ViewOutputImpl() { reset(); }
  void reset() override { w = register_parameter("w", at::arange(3.0)); }
  at::Tensor forward(const at::Tensor& x) { return w.view({1, 3}) + x.sum() * 0; }  // (1, 3) per replica
  at::Tensor w;
};
TORCH_MODULE(ViewOutput);

TEST(DataParallel, GradientSumNeverWritesIntoIncomingGradients) {
  ViewOutput model;
  DataParallel dp(model, cpu_devices(2));
  const auto out = dp(at::randn({4, 2}));  // (2, 3): one row per replica
  // The caller's own tensor is the incoming gradient; the replicas get views of its rows.
  const auto incoming = at::tensor({1.0f, 2.0f, 3.0f, 10.0f, 20.0f, 30.0f}).view({2, 3});
  const auto before = incoming.clone();
  out.backward(incoming);
  EXPECT_TRUE(at::equal(incoming, before));                              // untouched
  EXPECT_TRUE(at::equal(model->w.grad(), at::tensor({11.0f, 22.0f, 33.0f})));  // the sum of both rows
}

// One backward, then zeroed gradients: the next backward goes into defined .grad tensors,
// the path where DataParallel may sum gradients straight into .grad (Note [Summing straight
// into .grad]), which must still leave hooked parameters to AccumulateGrad.
void give_zeroed_grads(std::initializer_list<ConvNet*> models, const at::Tensor& x) {
  for (ConvNet* m : models) {
    (*m)->forward(x).sum().backward();
    for (auto& p : (*m)->parameters()) p.mutable_grad().zero_();
  }
}

TEST(DataParallel, ParameterHooksStillSeeTheSummedGradient) {
  torch::manual_seed(5);
  ConvNet model;
  ConvNet reference = copy_of(model);
  DataParallel dp(model, cpu_devices(2));
  const auto x = at::randn({10, 1, 12, 12});
  give_zeroed_grads({&model, &reference}, x);
  at::Tensor seen;
  model->parameters()[0].register_hook([&seen](const at::Tensor& g) { seen = g.clone(); });
  dp(x).sum().backward();
  reference(x).sum().backward();
  ASSERT_TRUE(seen.defined());
  EXPECT_LT(relative_error(seen, reference->parameters()[0].grad()), 1e-5);
  const auto got = model->parameters();
  const auto want = reference->parameters();
  for (size_t j = 0; j < got.size(); ++j) EXPECT_LT(relative_error(got[j].grad(), want[j].grad()), 1e-5) << j;
}

// Hooks on a parameter's gradient accumulator (what DDP-like code registers), and 2.1's
// post-accumulate-grad hooks, run after .grad is summed: the fast path must leave such
// parameters to the engine (Note [Summing straight into .grad]) so that the hooks fire and
// see the summed gradient.
struct CountingPostHook : torch::autograd::FunctionPostHook {
  explicit CountingPostHook(int* calls) : calls(calls) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ++*calls;
    return outputs;
  }
  int* calls;
};
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
struct GradAfterAccumulation : torch::autograd::PostAccumulateGradHook {
  explicit GradAfterAccumulation(at::Tensor* seen) : seen(seen) {}
  void operator()(const torch::autograd::Variable& param) override { *seen = param.grad().clone(); }
  at::Tensor* seen;
};
#endif

TEST(DataParallel, AccumulatorHooksFireOnThePathThatSumsIntoGrad) {
  torch::manual_seed(6);
  ConvNet model;
  ConvNet reference = copy_of(model);
  DataParallel dp(model, cpu_devices(2));
  const auto x = at::randn({10, 1, 12, 12});
  give_zeroed_grads({&model, &reference}, x);
  const auto params = model->parameters();
  int calls = 0;
  // Held, as DDP holds them: a tensor refers to its accumulator weakly.
  const auto accumulator = torch::autograd::impl::grad_accumulator(params[0]);
  accumulator->add_post_hook(std::make_unique<CountingPostHook>(&calls));
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  at::Tensor seen;
  torch::autograd::impl::set_post_acc_grad_hooks(params[1], std::make_unique<GradAfterAccumulation>(&seen));
#endif
  dp(x).sum().backward();
  reference(x).sum().backward();
  EXPECT_EQ(calls, 1);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  ASSERT_TRUE(seen.defined()) << "the post-accumulate-grad hook did not run";
  EXPECT_LT(relative_error(seen, reference->parameters()[1].grad()), 1e-5);
#endif
  const auto want = reference->parameters();
  for (size_t j = 0; j < params.size(); ++j) EXPECT_LT(relative_error(params[j].grad(), want[j].grad()), 1e-5) << j;
}

// libtorch 2.x's zero_grad() sets .grad to none: the device threads then store each summed
// gradient as .grad themselves, as AccumulateGrad would (its own tensor, contiguous, no
// history), and never into memory the caller still holds.
TEST(DataParallel, GradientsIntoUnsetGradsAreFreshTensors) {
  torch::manual_seed(8);
  ConvNet model;
  ConvNet reference = copy_of(model);
  DataParallel dp(model, cpu_devices(2));
  std::vector<at::Tensor> kept, kept_values;
  for (int step = 0; step < 2; ++step) {
    for (ConvNet* m : {&model, &reference}) {
      for (auto& p : (*m)->parameters()) p.mutable_grad() = at::Tensor();
    }
    const auto x = at::randn({10, 1, 12, 12});
    dp(x).sum().backward();
    reference(x).sum().backward();
    const auto got = model->parameters();
    const auto want = reference->parameters();
    std::set<const void*> storages;
    for (size_t j = 0; j < got.size(); ++j) {
      const at::Tensor& grad = got[j].grad();
      ASSERT_TRUE(grad.defined()) << j;
      EXPECT_TRUE(grad.is_contiguous()) << j;
      EXPECT_FALSE(grad.requires_grad()) << j;
      EXPECT_TRUE(storages.insert(grad.storage().data()).second) << "parameter " << j << " shares its .grad";
      EXPECT_LT(relative_error(grad, want[j].grad()), 1e-5) << "step " << step << ", parameter " << j;
    }
    if (step == 0) {
      for (const auto& p : got) {  // the caller keeps step 0's gradients
        kept.push_back(p.grad());
        kept_values.push_back(p.grad().clone());
      }
    }
  }
  // Step 1 wrote new tensors, not into step 0's that the caller kept.
  const auto params = model->parameters();
  for (size_t j = 0; j < params.size(); ++j) {
    EXPECT_NE(kept[j].data_ptr(), params[j].grad().data_ptr()) << j;
    EXPECT_TRUE(at::equal(kept[j], kept_values[j])) << j;
  }
}

// A linear layer whose forward also sleeps per row, as a slower device would take longer.
class SleepyLinearImpl : public torch::nn::Cloneable<SleepyLinearImpl> {
 public:
  SleepyLinearImpl() { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(8, 4)); }
  at::Tensor forward(const at::Tensor& x) {
    ++forwards;
    std::this_thread::sleep_for(std::chrono::microseconds(micros_per_step + micros_per_row * x.size(0)));
    return linear(x);
  }
  torch::nn::Linear linear{nullptr};
  int64_t micros_per_row = 0;  // copied into the replicas; set per replica after that
  int64_t micros_per_step = 0;
  int64_t forwards = 0;
};
TORCH_MODULE(SleepyLinear);

// DataParallel over two CPU devices with auto_balance, and the same model alone.
struct BalancedPair {
  BalancedPair() {
    torch::manual_seed(3);
    load_state_dict(*reference, state_dict(*model));
    DataParallelOptions options;
    options.devices = cpu_devices(2);
    options.auto_balance = true;
    dp.emplace(model, options);
  }

  // `steps` training steps of 64 rows; returns each step's split. Whatever the split, the
  // gradient is the whole batch's.
  std::vector<std::vector<int64_t>> train(int steps) {
    std::vector<std::vector<int64_t>> splits;
    for (int step = 0; step < steps; ++step) {
      const auto x = at::randn({64, 8});
      const auto target = at::randint(0, 4, {64});
      model->zero_grad();
      reference->zero_grad();
      at::cross_entropy_loss((*dp)(x), target).backward();
      at::cross_entropy_loss(reference(x), target).backward();
      splits.push_back(dp->last_chunk_sizes());
      EXPECT_LT(relative_error(model->linear->weight.grad(), reference->linear->weight.grad()), 1e-5) << step;
      EXPECT_LT(relative_error(model->linear->bias.grad(), reference->linear->bias.grad()), 1e-5) << step;
    }
    return splits;
  }

  SleepyLinear model;
  SleepyLinear reference;
  std::optional<DataParallel<SleepyLinearImpl>> dp;
};

TEST(DataParallel, AutoBalanceGivesTheSlowerDeviceFewerRowsAndTheSameGradients) {
  BalancedPair pair;
  DataParallel<SleepyLinearImpl>& dp = *pair.dp;
  dp.replicas()[0]->micros_per_row = 200;
  dp.replicas()[1]->micros_per_row = 600;  // 3x slower: 3/4 of the rows belong on cpu:0
  const std::vector<std::vector<int64_t>> splits = pair.train(14);
  EXPECT_EQ(splits.front(), (std::vector<int64_t>{32, 32}));  // even until measured
  const std::vector<int64_t>& last = splits.back();
  EXPECT_GE(last[0], 44) << last[0] << "/" << last[1];
  EXPECT_LE(last[0], 52) << last[0] << "/" << last[1];
  ASSERT_NE(dp.balancer(), nullptr);
  EXPECT_GE(dp.balancer()->rebalances(), 1);
  const std::vector<double> costs = dp.balancer()->seconds_per_row();
  EXPECT_GT(costs[1], costs[0]);

  // Without backward (evaluation), nothing is measured and the split stays.
  const int64_t rebalances = dp.balancer()->rebalances();
  {
    torch::NoGradGuard no_grad;
    for (int i = 0; i < 8; ++i) dp(at::randn({64, 8}));
  }
  EXPECT_EQ(dp.last_chunk_sizes(), last);
  EXPECT_EQ(dp.balancer()->rebalances(), rebalances);
}

// A device whose fixed cost per step is longer than the other's whole step (a CPU beside a
// GPU, docs/gpu.md) is left out: its replica runs nothing, and the gradient stays the whole
// batch's. By seconds per row alone it kept a row, and the step its 30 ms.
TEST(DataParallel, AutoBalanceLeavesOutADeviceNotWorthItsFixedCost) {
  BalancedPair pair;
  DataParallel<SleepyLinearImpl>& dp = *pair.dp;
  dp.replicas()[0]->micros_per_row = 200;
  dp.replicas()[1]->micros_per_row = 200;
  dp.replicas()[1]->micros_per_step = 30000;
  EXPECT_EQ(pair.train(24).back(), (std::vector<int64_t>{64, 0}));
  const int64_t ran = dp.replicas()[1]->forwards;
  pair.train(3);
  EXPECT_EQ(dp.replicas()[1]->forwards, ran);  // left out: its replica runs nothing
  EXPECT_EQ(dp.balancer()->weights()[1], 0.0);
  EXPECT_GT(dp.balancer()->fixed_seconds()[1], 0.02);
}

TEST(DataParallel, RejectsBadConfigurations) {
  ConvNet model;
  EXPECT_THROW_MSG(DataParallel(model, {Device::cpu(0), Device::cpu(0)}), InvalidArgumentError, "listed twice");
  EXPECT_THROW_MSG(DataParallel(model, DataParallelOptions{cpu_devices(2), std::nullopt, 0, {1, 1, 1}}),
                   InvalidArgumentError, "3 device weights for 2 devices");
  EXPECT_THROW_MSG(DataParallel(model, DataParallelOptions{cpu_devices(2), std::nullopt, 0, {0, 0}}),
                   InvalidArgumentError, "every device weight is 0");
  DataParallelOptions balanced{cpu_devices(2)};
  balanced.auto_balance = true;
  balanced.balance.window = 0;
  EXPECT_THROW_MSG(DataParallel(model, balanced), InvalidArgumentError, "window is 0");
}

}  // namespace
}  // namespace datapar
