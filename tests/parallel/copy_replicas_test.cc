// DataParallel with copy replicas (ReplicaStorage::kCopy): the path CUDA devices take,
// selected on CPU devices. Whatever changes the master between steps, every replica must
// compute with the master's current values, so that training matches one device.
//
// libtorch's optimizers write through p.data(), which shares the storage but not the
// version counter: a rule that copies only when the master's version or data pointer moved
// misses every optimizer step. These tests fail with such a rule.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <string>

#include "datapar/parallel/data_parallel.h"
#include "testing/models.h"

namespace datapar {
namespace {

using testing::ConvNet;

constexpr int kSteps = 5;
constexpr double kTolerance = 1e-6;

// Changes a model's parameters after a step's backward: an optimizer step, or whatever a
// user does by hand. Called with the same step index for the DataParallel master and the
// single-device reference.
struct Update {
  // Made once per model, over its parameters.
  std::function<std::function<void(ConvNet&, int)>(ConvNet&)> make;
};

// A double-precision ConvNet and its single-device twin, and DataParallel over `devices`
// CPU devices with copy replicas.
struct CopyTraining {
  explicit CopyTraining(uint64_t seed, int devices) : model((torch::manual_seed(seed), ConvNet())) {
    model->to(at::kDouble);
    reference = copy_of(model);
    reference->to(at::kDouble);
    DataParallelOptions options;
    options.devices = cpu_devices(devices);
    options.replicas = ReplicaStorage::kCopy;
    dp = std::make_unique<DataParallel<testing::ConvNetImpl>>(model.ptr(), options);
  }
  ConvNet model;
  ConvNet reference{nullptr};
  std::unique_ptr<DataParallel<testing::ConvNetImpl>> dp;
};

double max_difference(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

void expect_parameters_equal(const ConvNet& got, const ConvNet& want, const std::string& what) {
  const auto g = got->named_parameters();
  const auto w = want->named_parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t j = 0; j < g.size(); ++j) {
    EXPECT_LE(max_difference(g[j].value(), w[j].value()), kTolerance) << what << ": " << g[j].key();
  }
}

// Trains a double-precision ConvNet for kSteps on cpu:0-2 with copy replicas, and the same
// model on one device, and compares outputs every step and parameters at the end: the
// master's, and each replica's once the next forward has refreshed them.
void expect_training_matches_one_device(const Update& update) {
  CopyTraining t(/*seed=*/11, /*devices=*/3);
  ConvNet& model = t.model;
  ConvNet& reference = t.reference;
  DataParallel<testing::ConvNetImpl>& dp = *t.dp;
  auto step_dp = update.make(model);
  auto step_ref = update.make(reference);

  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor x = at::randn({15, 1, 12, 12}, at::kDouble);
    const at::Tensor y = at::randint(0, 10, {15}, at::kLong);
    model->zero_grad();
    reference->zero_grad();
    const at::Tensor out = dp(x);
    const at::Tensor out_ref = reference(x);
    ASSERT_LE(max_difference(out, out_ref), kTolerance) << "outputs of step " << step;
    at::cross_entropy_loss(out, y).backward();
    at::cross_entropy_loss(out_ref, y).backward();
    step_dp(model, step);
    step_ref(reference, step);
  }
  expect_parameters_equal(model, reference, "master");

  {
    at::NoGradGuard no_grad;
    const at::Tensor x = at::randn({15, 1, 12, 12}, at::kDouble);
    EXPECT_LE(max_difference(dp(x), reference(x)), kTolerance) << "outputs after training";
  }
  ASSERT_EQ(dp.replicas().size(), 3u);
  for (size_t r = 0; r < dp.replicas().size(); ++r) {
    expect_parameters_equal(ConvNet(dp.replicas()[r]), reference, "replica " + std::to_string(r));
    if (r > 0) {  // a copy, not the master's memory
      EXPECT_NE(dp.replicas()[r]->parameters()[0].data_ptr(), model->parameters()[0].data_ptr());
    }
  }
  EXPECT_GT(dp.parameter_copies(), 0);
}

template <typename Optimizer, typename Options>
Update optimizer_update(Options options) {
  return {[options](ConvNet& model) {
    auto optimizer = std::make_shared<Optimizer>(model->parameters(), options);
    return std::function<void(ConvNet&, int)>([optimizer](ConvNet&, int) { optimizer->step(); });
  }};
}

TEST(CopyReplicas, PlainSgdMatchesOneDevice) {
  expect_training_matches_one_device(optimizer_update<torch::optim::SGD>(torch::optim::SGDOptions(0.1)));
}

TEST(CopyReplicas, SgdWithMomentumMatchesOneDevice) {
  expect_training_matches_one_device(optimizer_update<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)));
}

TEST(CopyReplicas, SgdWithWeightDecayMatchesOneDevice) {
  expect_training_matches_one_device(
      optimizer_update<torch::optim::SGD>(torch::optim::SGDOptions(0.1).weight_decay(0.01)));
}

TEST(CopyReplicas, AdamMatchesOneDevice) {
  expect_training_matches_one_device(optimizer_update<torch::optim::Adam>(torch::optim::AdamOptions(0.01)));
}

TEST(CopyReplicas, AdamWMatchesOneDevice) {
  expect_training_matches_one_device(
      optimizer_update<torch::optim::AdamW>(torch::optim::AdamWOptions(0.01).weight_decay(0.1)));
}

// What hand-written training loops do: write through .data(), no optimizer.
TEST(CopyReplicas, HandWrittenDataUpdatesMatchOneDevice) {
  expect_training_matches_one_device({[](ConvNet&) {
    return std::function<void(ConvNet&, int)>([](ConvNet& model, int) {
      for (at::Tensor& p : model->parameters()) {
        p.data().mul_(0.9);
        p.data().sub_(0.1 * p.grad());
      }
    });
  }});
}

// A state dict loaded between steps (e.g. an averaged or restored model).
TEST(CopyReplicas, LoadStateDictBetweenStepsMatchesOneDevice) {
  torch::manual_seed(5);
  ConvNet other;
  other->to(at::kDouble);
  const StateDict loaded = state_dict(*other);
  expect_training_matches_one_device({[loaded](ConvNet& model) {
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    return std::function<void(ConvNet&, int)>([sgd, loaded](ConvNet& m, int step) {
      sgd->step();
      if (step == 2) load_state_dict(*m, loaded);
    });
  }});
}

// Parameters whose tensors the user replaced (set_data: new memory, same parameter).
TEST(CopyReplicas, ReplacedParametersMatchOneDevice) {
  expect_training_matches_one_device({[](ConvNet& model) {
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    return std::function<void(ConvNet&, int)>([sgd](ConvNet& m, int step) {
      sgd->step();
      if (step % 2 == 1) {
        at::NoGradGuard no_grad;
        for (at::Tensor& p : m->parameters()) p.set_data(p.detach().mul(0.5));
      }
    });
  }});
}

// Refreshing a copy must not invalidate the graph of an earlier forward that saved it: two
// forwards, then one backward over both (gradient accumulation written as one loss).
TEST(CopyReplicas, TwoForwardsThenOneBackward) {
  CopyTraining t(/*seed=*/13, /*devices=*/2);
  ConvNet& model = t.model;
  ConvNet& reference = t.reference;
  DataParallel<testing::ConvNetImpl>& dp = *t.dp;
  const at::Tensor x1 = at::randn({6, 1, 12, 12}, at::kDouble), x2 = at::randn({6, 1, 12, 12}, at::kDouble);
  const at::Tensor y1 = at::randint(0, 10, {6}), y2 = at::randint(0, 10, {6});
  (at::cross_entropy_loss(dp(x1), y1) + at::cross_entropy_loss(dp(x2), y2)).backward();
  (at::cross_entropy_loss(reference(x1), y1) + at::cross_entropy_loss(reference(x2), y2)).backward();
  const auto got = model->named_parameters();
  const auto want = reference->named_parameters();
  for (size_t j = 0; j < got.size(); ++j) {
    EXPECT_LE(max_difference(got[j].value().grad(), want[j].value().grad()), kTolerance) << got[j].key();
  }
}

// The shared default on CPU devices trains the same way without a single copy.
TEST(CopyReplicas, SharedReplicasNeedNoCopies) {
  torch::manual_seed(11);
  ConvNet model;
  DataParallel dp(model, cpu_devices(3));
  EXPECT_EQ(dp.options().replicas, ReplicaStorage::kShared);
  torch::optim::SGD sgd(dp.parameters(), 0.1);
  for (int step = 0; step < 2; ++step) {
    sgd.zero_grad();
    at::cross_entropy_loss(dp(at::randn({6, 1, 12, 12})), at::randint(0, 10, {6})).backward();
    sgd.step();
  }
  EXPECT_EQ(dp.parameter_copies(), 0);
}

// Note [One copy per replica]: the master's parameters and each copy replica's lie back to
// back in one buffer (one dtype here), so that a refresh is one copy per replica; the module
// keeps its parameter objects. A parameter pointed elsewhere later unpacks them, and the
// refresh copies parameter by parameter, still right (ReplacedParametersMatchOneDevice).
TEST(CopyReplicas, EachReplicaIsRefreshedWithOneCopy) {
  torch::manual_seed(3);
  ConvNet model;
  const std::vector<at::Tensor> before = model->parameters();
  std::vector<at::Tensor> values;
  for (const at::Tensor& p : before) values.push_back(p.detach().clone());
  DataParallelOptions options;
  options.devices = cpu_devices(3);
  options.replicas = ReplicaStorage::kCopy;
  DataParallel<testing::ConvNetImpl> dp(model.ptr(), options);
  auto back_to_back = [](const std::vector<at::Tensor>& params) {
    for (size_t j = 1; j < params.size(); ++j) {
      if (static_cast<const char*>(params[j].data_ptr()) !=
          static_cast<const char*>(params[j - 1].data_ptr()) + params[j - 1].nbytes()) {
        return false;
      }
    }
    return true;
  };
  const std::vector<at::Tensor> after = model->parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t j = 0; j < after.size(); ++j) {
    EXPECT_EQ(after[j].unsafeGetTensorImpl(), before[j].unsafeGetTensorImpl()) << "parameter " << j;
    EXPECT_TRUE(at::equal(after[j], values[j])) << "parameter " << j;
  }
  EXPECT_TRUE(back_to_back(after)) << "the master's parameters";
  for (size_t r = 1; r < 3; ++r) EXPECT_TRUE(back_to_back(dp.replicas()[r]->parameters())) << "replica " << r;

  const at::Tensor x = at::randn({6, 1, 12, 12});
  {
    const at::NoGradGuard no_grad;
    for (const at::Tensor& p : model->parameters()) p.add_(1);  // as an optimizer writes: p.data()
    const at::Tensor out = dp(x);
    EXPECT_TRUE(at::allclose(out, model->forward(x), 1e-5, 1e-6));
    for (size_t r = 1; r < 3; ++r) {
      const auto replica = dp.replicas()[r]->parameters();
      for (size_t j = 0; j < after.size(); ++j) EXPECT_TRUE(at::equal(replica[j], after[j])) << r << ", " << j;
    }
  }
  EXPECT_EQ(dp.parameter_copies(), 2 * 2 * static_cast<int64_t>(after.size()));  // 2 refreshes x 2 copy replicas
}

}  // namespace
}  // namespace datapar
