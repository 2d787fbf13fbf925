// Activation checkpointing (datapar/autograd/checkpoint.h): the gradients of a checkpointed
// segment equal those without it, dropout included; what the recomputation must match; and
// DDP over a checkpointed model (ranks as threads, so the TSan suite runs it too).
#include "datapar/autograd/checkpoint.h"
#include "datapar/autograd/checkpoint_wrapper.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <mutex>
#include <vector>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"

namespace datapar {
namespace {

// A model in two parts: `front` is the segment a test may checkpoint.
struct Model {
  Model()
      : front(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Dropout(0.5), torch::nn::Linear(16, 16)),
        back(torch::nn::Tanh(), torch::nn::Linear(16, 4)) {}
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> all = front->parameters();
    for (const at::Tensor& p : back->parameters()) all.push_back(p);
    return all;
  }
  // `options` null: front runs plainly.
  at::Tensor forward(const at::Tensor& x, const CheckpointOptions* options) {
    const at::Tensor h = options ? checkpoint([this](const at::Tensor& in) { return front->forward(in); }, x, *options)
                                 : front->forward(x);
    return back->forward(h);
  }
  torch::nn::Sequential front;
  torch::nn::Sequential back;
};

struct Gradients {
  std::vector<at::Tensor> params;
  at::Tensor input;      // undefined when the input needs none
  double next_draw = 0;  // from the RNG stream after backward
};

// One backward of sum(model(x)^2), the RNG seeded alike before the forward.
Gradients gradients(Model& model, const at::Tensor& x, const CheckpointOptions* options) {
  for (at::Tensor& p : model.parameters()) p.mutable_grad() = at::Tensor();
  if (x.requires_grad()) x.mutable_grad() = at::Tensor();
  torch::manual_seed(7);
  model.forward(x, options).pow(2).sum().backward();
  Gradients g;
  for (const at::Tensor& p : model.parameters()) g.params.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  if (x.requires_grad()) g.input = x.grad().clone();
  g.next_draw = at::rand({1}).item<double>();
  return g;
}

void expect_equal(const Gradients& got, const Gradients& want) {
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i) {
    ASSERT_TRUE(got.params[i].defined()) << "parameter " << i << " got no gradient";
    EXPECT_TRUE(at::equal(got.params[i], want.params[i])) << "parameter " << i;
  }
  EXPECT_EQ(got.input.defined(), want.input.defined());
  if (want.input.defined()) EXPECT_TRUE(at::equal(got.input, want.input));
  EXPECT_EQ(got.next_draw, want.next_draw) << "the RNG stream after backward";
}

// Dropout draws the same mask in the recomputation (the RNG state of the forward is
// restored for it, and the program's stream left where it was): the same gradients to the bit.
const CheckpointOptions kPreserve;

TEST(ActivationCheckpoint, GivesTheGradientsOfTheSegmentRunPlainly) {
  torch::manual_seed(1);
  Model model;
  const at::Tensor x = at::randn({5, 8}).requires_grad_(true);
  const Gradients plain = gradients(model, x, nullptr);
  expect_equal(gradients(model, x, &kPreserve), plain);
  // Without the forward's RNG state the recomputation draws another dropout mask.
  CheckpointOptions fresh;
  fresh.preserve_rng_state = false;
  EXPECT_FALSE(at::equal(gradients(model, x, &fresh).params[0], plain.params[0]));
}

// The segment's parameters get their gradients although its input needs none (PyTorch's
// reentrant checkpoint gives them none then, with a warning).
TEST(ActivationCheckpoint, ParametersGetGradientsWhenTheInputNeedsNone) {
  torch::manual_seed(2);
  Model model;
  const at::Tensor x = at::randn({5, 8});
  expect_equal(gradients(model, x, &kPreserve), gradients(model, x, nullptr));
}

// Several inputs and outputs: one input needs no gradient, an integer output has none,
// and an output that is an input itself keeps that input's own history.
TEST(ActivationCheckpoint, SeveralInputsAndOutputs) {
  const at::Tensor a = at::randn({3, 4}).requires_grad_(true);
  const at::Tensor b = at::randn({3, 4});
  const at::Tensor w = at::randn({4, 4}).requires_grad_(true);
  const Segment segment = [&](const std::vector<at::Tensor>& in) {
    const at::Tensor y = at::matmul(in[0] * in[1], w).sin();
    return std::vector<at::Tensor>{y, y.argmax(1), in[0]};
  };
  const std::vector<at::Tensor> plain = segment({a, b});
  (plain[0].sum() + plain[2].pow(2).sum()).backward();
  const at::Tensor want_a = a.grad().clone(), want_w = w.grad().clone();
  a.mutable_grad() = at::Tensor();
  w.mutable_grad() = at::Tensor();

  const std::vector<at::Tensor> out = checkpoint(segment, {a, b});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_TRUE(at::equal(out[1], plain[1]));
  EXPECT_TRUE(a.is_leaf()) << "the input itself kept its history";
  (out[0].sum() + out[2].pow(2).sum()).backward();
  EXPECT_TRUE(at::allclose(a.grad(), want_a));
  EXPECT_TRUE(at::equal(w.grad(), want_w));
}

TEST(ActivationCheckpoint, OutsideGradModeItJustRunsTheSegment) {
  const at::Tensor x = at::randn({2, 2}).requires_grad_(true);
  const at::NoGradGuard no_grad;
  const at::Tensor y = checkpoint([](const at::Tensor& in) { return in * 2; }, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(at::equal(y, x * 2));
}

TEST(ActivationCheckpoint, ARecomputationThatDiffersIsAnError) {
  const at::Tensor x = at::randn({4, 3}).requires_grad_(true);
  int calls = 0;
  const at::Tensor y = checkpoint([&](const at::Tensor& in) { return in.narrow(0, 0, ++calls).exp(); }, x);
  EXPECT_THROW_MSG(y.sum().backward(), InvalidArgumentError, "must compute the same thing both times");
}

TEST(ActivationCheckpoint, AnInputChangedInPlaceAfterTheForwardIsAnError) {
  const at::Tensor w = at::randn({3}).requires_grad_(true);
  at::Tensor x = at::randn({3});
  const at::Tensor y = checkpoint([&](const at::Tensor& in) { return in * w; }, x);
  x.add_(1);
  EXPECT_THROW_MSG(y.sum().backward(), InvalidArgumentError, "modified in place after the segment's forward");
}

TEST(ActivationCheckpoint, ASecondBackwardIsAnError) {
  const at::Tensor x = at::randn({3}).requires_grad_(true);
  const at::Tensor y = checkpoint([](const at::Tensor& in) { return in.exp(); }, x).sum();
  y.backward();
  EXPECT_THROW_MSG(y.backward(), InvalidArgumentError, "a second backward through a checkpointed segment");
}

// The default generator is not thread-safe, and constructing or cloning a module draws
// from it.
std::mutex g_checkpoint_generator;

// A segment of a model, checkpointed.
struct CheckpointedSegmentImpl : torch::nn::Module {
  explicit CheckpointedSegmentImpl(torch::nn::Sequential segment) : inner(register_module("inner", std::move(segment))) {}
  at::Tensor forward(const at::Tensor& x) {
    return checkpoint([this](const at::Tensor& in) { return inner->forward(in); }, x);
  }
  torch::nn::Sequential inner;
};
TORCH_MODULE(CheckpointedSegment);

// DDP's end of backward must wait for the outer backward, not the recomputation's (Note
// [Backward inside backward] in src/autograd/checkpoint.cc): here the checkpointed segment
// is the model's last, so the first gradients (and DDP's first bucket) come from inside the
// recomputation, while the first layer's come after it.
TEST(ActivationCheckpoint, UnderDdpEveryRankGetsTheAveragedGradients) {
  constexpr int kWorld = 2;
  testing::run_gloo_ranks(kWorld, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model;
    {
      const std::lock_guard<std::mutex> lock(g_checkpoint_generator);
      torch::manual_seed(rank);  // DDP starts every rank from rank 0's
      model = torch::nn::Sequential(
          torch::nn::Linear(6, 32),
          CheckpointedSegment(torch::nn::Sequential(torch::nn::Linear(32, 32), torch::nn::Tanh(), torch::nn::Linear(32, 3))));
    }
    DdpOptions options;
    options.bucket_cap_mb = 0.002;  // several buckets
    options.first_bucket_cap_mb = 0.001;
    DistributedDataParallel ddp(model, group, options);
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < kWorld; ++r) inputs.push_back(at::full({4, 6}, 0.1 * (r + 1)));
    // What one process gets, averaged over the ranks' inputs (the models are equal now).
    std::vector<at::Tensor> want;
    for (const at::Tensor& x : inputs) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      model->forward(x).pow(2).sum().backward();
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        if (want.size() <= i) want.push_back(at::zeros_like(params[i]));
        want[i] += params[i].grad() / kWorld;
      }
    }
    for (int step = 0; step < 2; ++step) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      ddp.forward(inputs[rank]).pow(2).sum().backward();
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        ASSERT_TRUE(params[i].grad().defined()) << "rank " << rank << " parameter " << i;
        EXPECT_TRUE(at::allclose(params[i].grad(), want[i], 1e-5, 1e-6)) << "rank " << rank << " step " << step
                                                                          << " parameter " << i;
      }
    }
  });
}

// checkpoint_each: the model's blocks recomputed in backward (each block's forward runs twice
// per step), its names and gradients those of the unwrapped model.
struct CountingBlockImpl : torch::nn::Module {
  CountingBlockImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    ++calls;
    return at::tanh(fc->forward(x));
  }
  torch::nn::Linear fc;
  int calls = 0;
};

TEST(ActivationCheckpoint, CheckpointEachWrapsTheBlocksAndKeepsTheirNames) {
  auto make = [] {
    const std::lock_guard<std::mutex> lock(g_checkpoint_generator);
    torch::manual_seed(3);
    return torch::nn::Sequential(CountingBlockImpl(), torch::nn::ReLU(), CountingBlockImpl());
  };
  torch::nn::Sequential plain = make();
  torch::nn::Sequential wrapped = make();
  const auto names = wrapped->named_parameters().keys();
  EXPECT_EQ(datapar::checkpoint_each<CountingBlockImpl>(*wrapped), 2);
  EXPECT_EQ(wrapped->named_parameters().keys(), names);
  const at::Tensor x = at::randn({3, 4});
  plain->forward(x).pow(2).sum().backward();
  wrapped->forward(x).pow(2).sum().backward();
  for (const auto& item : plain->named_parameters()) {
    EXPECT_TRUE(at::allclose(wrapped->named_parameters()[item.key()].grad(), item.value().grad())) << item.key();
  }
  EXPECT_EQ(plain[0]->as<CountingBlockImpl>()->calls, 1);
  auto* block = wrapped[0]->as<datapar::CheckpointedImpl<CountingBlockImpl>>();
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(block->module()->calls, 2) << "forward, then the recomputation in backward";
}

}  // namespace
}  // namespace datapar
