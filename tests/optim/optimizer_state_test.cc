// optimizer_state_dict / load_optimizer_state_dict (PyTorch's layout) and the RNG state.
#include "datapar/optim/optimizer_state.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <memory>

#include "datapar/error.h"
#include "datapar/optim/optimizer_factory.h"
#include "datapar/train/rng_state.h"
#include "testing/expect_throw.h"

namespace datapar::train {
namespace {

using c10::IValue;
namespace optim = torch::optim;

// Two linear layers; the optimizer gets them as two parameter groups.
struct Layers {
  Layers() : a(3, 4), b(4, 2) {}
  void step(optim::Optimizer& opt, int times) {
    for (int i = 0; i < times; ++i) {
      opt.zero_grad();
      b->forward(a->forward(at::linspace(-1, 1, 6).view({2, 3}))).pow(2).sum().backward();
      opt.step();
    }
  }
  std::vector<optim::OptimizerParamGroup> groups() { return {a->parameters(), b->parameters()}; }
  torch::nn::Linear a, b;
};

TEST(CheckpointOptimizerState, SgdUsesPyTorchsLayout) {
  Layers s;
  optim::SGD opt(s.groups(), optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01).nesterov(false));
  s.step(opt, 1);
  const OptimizerState state = optimizer_state_dict(opt);
  const auto groups = state.at("param_groups").toListRef();
  ASSERT_EQ(groups.size(), 2u);
  const auto g1 = groups[1].toGenericDict();
  EXPECT_EQ(g1.at("params").toListRef().vec(), (std::vector<IValue>{int64_t{2}, int64_t{3}}));  // numbered across groups
  EXPECT_DOUBLE_EQ(g1.at("lr").toDouble(), 0.1);
  EXPECT_DOUBLE_EQ(g1.at("momentum").toDouble(), 0.9);
  EXPECT_DOUBLE_EQ(g1.at("dampening").toDouble(), 0.1);
  EXPECT_DOUBLE_EQ(g1.at("weight_decay").toDouble(), 0.01);
  EXPECT_FALSE(g1.at("nesterov").toBool());
  EXPECT_FALSE(g1.at("maximize").toBool());
  const auto per_param = state.at("state").toGenericDict();
  ASSERT_EQ(per_param.size(), 4u);
  EXPECT_EQ(per_param.at(int64_t{3}).toGenericDict().at("momentum_buffer").toTensor().sizes(), s.b->bias.sizes());
}

template <typename Opt, typename Options>
void expect_round_trip(Options options, Options other) {
  Layers s;
  Opt opt(s.groups(), options);
  s.step(opt, 3);
  Layers copy;
  for (size_t i = 0; i < 2; ++i) {  // same starting parameters
    at::NoGradGuard no_grad;
    copy.a->parameters()[i].copy_(s.a->parameters()[i]);
    copy.b->parameters()[i].copy_(s.b->parameters()[i]);
  }
  Opt loaded(copy.groups(), other);
  load_optimizer_state_dict(loaded, optimizer_state_dict(opt));
  s.step(opt, 2);
  copy.step(loaded, 2);
  EXPECT_TRUE(at::equal(s.a->weight, copy.a->weight));
  EXPECT_TRUE(at::equal(s.b->bias, copy.b->bias));
}

TEST(CheckpointOptimizerState, SgdRoundTripContinuesIdentically) {
  expect_round_trip<optim::SGD>(optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3),
                                optim::SGDOptions(0.5));
}

TEST(CheckpointOptimizerState, AdamAndAdamWRoundTripContinueIdentically) {
  expect_round_trip<optim::Adam>(optim::AdamOptions(0.01).amsgrad(true).betas({0.8, 0.99}), optim::AdamOptions(0.3));
  expect_round_trip<optim::AdamW>(optim::AdamWOptions(0.01).weight_decay(0.1), optim::AdamWOptions(0.3));
  Layers s;
  optim::Adam adam(s.groups(), optim::AdamOptions(0.01));
  s.step(adam, 3);
  const auto st = optimizer_state_dict(adam).at("state").toGenericDict().at(int64_t{0}).toGenericDict();
  EXPECT_EQ(st.at("step").toTensor().item<float>(), 3.0f);  // a float32 tensor, as in Python
}

TEST(CheckpointOptimizerState, MismatchesAreNamedAndChangeNothing) {
  Layers s;
  optim::SGD opt(s.groups(), optim::SGDOptions(0.1).momentum(0.9));
  s.step(opt, 1);
  const OptimizerState saved = optimizer_state_dict(opt);

  optim::SGD one_group(s.a->parameters(), optim::SGDOptions(0.2).momentum(0.5));
  EXPECT_THROW_MSG(load_optimizer_state_dict(one_group, saved), InvalidArgumentError,
                   "it has 2 parameter groups but the optimizer has 1");
  std::vector<optim::OptimizerParamGroup> uneven{s.a->parameters(), optim::OptimizerParamGroup(std::vector<at::Tensor>{s.b->weight})};
  optim::SGD fewer(uneven, optim::SGDOptions(0.2).momentum(0.5));
  EXPECT_THROW_MSG(load_optimizer_state_dict(fewer, saved), InvalidArgumentError,
                   "parameter group 1 has 2 parameters but the optimizer's has 1");

  Layers t;
  optim::SGD target(t.groups(), optim::SGDOptions(0.2).momentum(0.5));
  OptimizerState bad = optimizer_state_dict(opt);  // fresh dicts, tensors shared
  auto state = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  for (const auto& e : saved.at("state").toGenericDict()) state.insert(e.key(), e.value());
  auto wrong = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  wrong.insert("momentum_buffer", at::zeros({7}));
  state.insert_or_assign(int64_t{1}, wrong);
  bad.insert_or_assign("state", state);
  EXPECT_THROW_MSG(load_optimizer_state_dict(target, bad), InvalidArgumentError,
                   "the state of parameter 1 \"momentum_buffer\" has shape [7] but the parameter has [4]");
  // Issue 27: another dtype is refused, not cast (int64 failed at the first step, float64
  // was taken silently).
  for (const at::ScalarType dtype : {at::kLong, at::kDouble}) {
    wrong.insert_or_assign("momentum_buffer", at::zeros({4}, dtype));
    state.insert_or_assign(int64_t{1}, wrong);
    bad.insert_or_assign("state", state);
    EXPECT_THROW_MSG(load_optimizer_state_dict(target, bad), InvalidArgumentError,
                     std::string("the state of parameter 1 \"momentum_buffer\" is ") + c10::toString(dtype) +
                         " but the parameter is Float");
  }
  EXPECT_TRUE(target.state().empty());  // unchanged
  EXPECT_DOUBLE_EQ(target.param_groups()[0].options().get_lr(), 0.2);

  optim::RMSprop rmsprop(s.a->parameters(), optim::RMSpropOptions(0.1));
  EXPECT_THROW_MSG(optimizer_state_dict(rmsprop), InvalidArgumentError, "SGD, Adam and AdamW");
  optim::Adam adam(t.groups(), optim::AdamOptions(0.1));
  EXPECT_THROW_MSG(load_optimizer_state_dict(adam, saved), InvalidArgumentError, "has no \"betas\"");
}

// optimizer_like: what ZeRO, FSDP and the tool make their optimizers with: the same kind, a
// copy of the options as they are when asked (a scheduler's lr included), stepping as the
// original would on the same parameters; any other kind is refused with what to do.
TEST(OptimizerLike, MakesTheSameKindWithTheSameOptionsAndRefusesOthers) {
  Layers s, t;
  optim::AdamW adamw(s.a->parameters(), optim::AdamWOptions(0.01).weight_decay(0.2).betas({0.8, 0.9}).amsgrad(true));
  static_cast<optim::AdamWOptions&>(adamw.param_groups()[0].options()).lr(0.05);  // as a scheduler would
  const OptimizerFactory make = optimizer_like(adamw);
  static_cast<optim::AdamWOptions&>(adamw.param_groups()[0].options()).lr(0.5);  // after: not seen
  const std::unique_ptr<optim::Optimizer> copy = make(t.a->parameters());
  ASSERT_NE(dynamic_cast<optim::AdamW*>(copy.get()), nullptr);
  const auto& o = static_cast<const optim::AdamWOptions&>(copy->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.lr(), 0.05);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.2);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.9);
  EXPECT_TRUE(o.amsgrad());
  for (const auto& [kind, original] :
       {std::make_pair(std::string("SGD"), std::shared_ptr<optim::Optimizer>(std::make_shared<optim::SGD>(
                                               s.b->parameters(), optim::SGDOptions(0.1).momentum(0.9).nesterov(true)))),
        std::make_pair(std::string("Adam"), std::shared_ptr<optim::Optimizer>(std::make_shared<optim::Adam>(
                                                s.b->parameters(), optim::AdamOptions(0.01).weight_decay(0.1))))}) {
    torch::nn::Linear twin(4, 2);
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < twin->parameters().size(); ++i) twin->parameters()[i].copy_(s.b->parameters()[i]);
    }
    const std::unique_ptr<optim::Optimizer> made = optimizer_like(*original)(twin->parameters());
    for (int step = 0; step < 3; ++step) {
      for (auto* pair : {&s.b, &twin}) {
        (*pair)->zero_grad();
        (*pair)->forward(at::linspace(-1, 1, 8).view({2, 4})).pow(2).sum().backward();
      }
      original->step();
      made->step();
    }
    for (size_t i = 0; i < twin->parameters().size(); ++i) {
      EXPECT_TRUE(at::equal(twin->parameters()[i], s.b->parameters()[i])) << kind << ", parameter " << i;
    }
  }
  optim::RMSprop rmsprop(s.a->parameters(), optim::RMSpropOptions(0.1));
  EXPECT_THROW_MSG(optimizer_like(rmsprop), InvalidArgumentError,
                   "cannot be copied by datapar (SGD, Adam and AdamW can).\n---> HINT: write the OptimizerFactory");
}

TEST(CheckpointRng, StateRestoresTheSameDraws) {
  const RngState state = get_rng_state();
  const at::Tensor first = at::randn({5});
  at::randn({100});
  set_rng_state(state);
  EXPECT_TRUE(at::equal(at::randn({5}), first));
  EXPECT_THROW_MSG(set_rng_state({at::zeros({3}), {}}), InvalidArgumentError, "must be a CPU uint8 tensor");
  EXPECT_THROW_MSG(set_rng_state({at::zeros({3}, at::kByte), {}}), InvalidArgumentError, "state (3 bytes) was refused");
}

}  // namespace
}  // namespace datapar::train
