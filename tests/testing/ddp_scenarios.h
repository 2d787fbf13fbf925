// DDP training scenarios shared by the worker processes (ddp_probe) and the tests, which
// train the same steps in one process on the concatenated batches as the reference.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/sync_batch_norm.h"
#include <torch/nn/modules/conv.h>

namespace datapar::testing {

// fc1 -> ReLU -> fc2, plus a branch `extra` added only when use_extra is true, so a rank
// can leave parameters unused. (B, 20) -> (B, 5).
class ProbeNetImpl : public torch::nn::Cloneable<ProbeNetImpl> {
 public:
  explicit ProbeNetImpl(int64_t hidden = 32) : hidden_(hidden) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(20, hidden_));
    fc2 = register_module("fc2", torch::nn::Linear(hidden_, 5));
    extra = register_module("extra", torch::nn::Linear(20, 5));
  }
  at::Tensor forward(const at::Tensor& x, bool use_extra) {
    at::Tensor out = fc2->forward(at::relu(fc1->forward(x)));
    return use_extra ? out + extra->forward(x) : out;
  }
  int64_t hidden_;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, extra{nullptr};
};
TORCH_MODULE(ProbeNet);

// A small CNN with SyncBatchNorm: (B, 20) seen as (B, 1, 4, 5) -> conv 3x3 (4 channels) ->
// SyncBatchNorm -> ReLU -> Linear(80, 5). Same forward signature as ProbeNet.
class SyncBnNetImpl : public torch::nn::Cloneable<SyncBnNetImpl> {
 public:
  SyncBnNetImpl() { reset(); }
  void reset() override {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    bn = register_module("bn", SyncBatchNorm(4));
    fc = register_module("fc", torch::nn::Linear(80, 5));
  }
  at::Tensor forward(const at::Tensor& x, bool /*use_extra*/) {
    at::Tensor h = at::relu(bn->forward(conv->forward(x.view({-1, 1, 4, 5}))));
    return fc->forward(h.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  SyncBatchNorm bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SyncBnNet);

struct DdpScenario {
  int world = 2;
  std::vector<std::vector<int64_t>> rows;  // rows[step][rank]; 0: the rank has run out of data
  bool micro_batches = false;              // two micro-batches per step, the first under no_sync
  int unused_on_rank = -1;                 // this rank never uses `extra`
  bool every_rank_uses_extra = false;      // else nobody does (except per unused_on_rank)
  bool join = false;
  bool sync_bn = false;  // train SyncBnNet instead of ProbeNet
  std::string optimizer = "sgd";  // sgd (momentum 0.9), adam, adamw
  bool zero = false;              // under ZeroRedundancyOptimizer
  // zero: after `resume_after` steps, checkpoint the consolidated state and go on from the
  // checkpoint, sharded again (or, with resume_plain, with an ordinary optimizer).
  int resume_after = -1;
  bool resume_plain = false;
  double loss_scale = 1;  // the loss is the batch's mean cross entropy times this
  DdpOptions options;
};

inline DdpScenario scenario(const std::string& name, int world) {
  DdpScenario s;
  s.world = world;
  const std::vector<int64_t> even(world, 8);
  s.rows.assign(5, even);
  s.options.first_bucket_cap_mb = 0.002;  // several small buckets
  s.options.bucket_cap_mb = 0.004;
  s.every_rank_uses_extra = true;
  if (name == "even") return s;
  if (name.rfind("zero_", 0) == 0) {  // zero_<optimizer>[_resume[_plain]]
    s.zero = true;
    std::string rest = name.substr(5);
    if (const size_t at = rest.find("_resume"); at != std::string::npos) {
      s.resume_after = 3;
      s.resume_plain = rest.substr(at) == "_resume_plain";
      rest = rest.substr(0, at);
    }
    s.optimizer = rest;
    if (s.optimizer != "sgd" && s.optimizer != "adam" && s.optimizer != "adamw") {
      throw std::invalid_argument("unknown DDP scenario " + name);
    }
    return s;
  }
  if (name == "uneven") {
    for (int step = 0; step < 5; ++step) {
      for (int r = 0; r < world; ++r) s.rows[step][r] = 3 + 4 * r + step;
    }
    s.options.average_by_samples = true;
  } else if (name == "no_sync") {
    s.micro_batches = true;
  } else if (name == "unused") {
    s.unused_on_rank = 1;
    s.options.find_unused_parameters = true;
  } else if (name == "bucket_view") {
    s.options.gradient_as_bucket_view = true;
  } else if (name == "one_bucket") {
    s.options.first_bucket_cap_mb = s.options.bucket_cap_mb = 25;
  } else if (name == "bf16" || name == "fp16") {
    // Set by the caller: register_comm_hook(bf16_compress_hook() or fp16_compress_hook()).
  } else if (name == "fp16_8192") {
    // fp16_compress_hook over a global batch of 8192, averaged by samples, the loss scaled
    // by 50 (gradients of about ten): the wire must carry each rank's share of the gradient;
    // n_r times it overflows float16 (measured with PyTorch: NaN from the first step).
    for (int step = 0; step < 5; ++step) {
      for (int r = 0; r < world; ++r) s.rows[step][r] = 8192 / world + (r == 0 ? 8192 % world : 0);
    }
    s.loss_scale = 50;
    s.options.average_by_samples = true;
  } else if (name == "sync_bn") {
    s.sync_bn = true;
  } else if (name == "join") {
    // Rank r has r * 2 + 1 batches: rank 0 stops after one.
    s.rows.assign(2 * (world - 1) + 1, std::vector<int64_t>(world, 0));
    for (int r = 0; r < world; ++r) {
      for (int step = 0; step < 2 * r + 1; ++step) s.rows[step][r] = 6 + r;
    }
    s.join = true;
    s.options.average_by_samples = true;
  } else {
    throw std::invalid_argument("unknown DDP scenario " + name);
  }
  return s;
}

// The step's batch of every rank: rows drawn from one stream, rank after rank.
inline std::vector<std::pair<at::Tensor, at::Tensor>> step_data(const DdpScenario& s, int step, int micro) {
  int64_t total = 0;
  for (int64_t n : s.rows[step]) total += n;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 10 * step + micro);
  const at::Tensor x = at::randn({total, 20}, gen, at::kFloat);
  const at::Tensor y = at::randint(5, {total}, gen, at::kLong);
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  int64_t offset = 0;
  for (int64_t n : s.rows[step]) {
    out.emplace_back(x.narrow(0, offset, n), y.narrow(0, offset, n));
    offset += n;
  }
  return out;
}

inline bool uses_extra(const DdpScenario& s, int rank) {
  return rank != s.unused_on_rank && s.every_rank_uses_extra;
}

inline torch::optim::SGD make_sgd(const std::vector<at::Tensor>& params) {
  return torch::optim::SGD(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                               const std::vector<at::Tensor>& params) {
  if (kind == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
  if (kind == "adamw") {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  }
  return std::make_unique<torch::optim::SGD>(make_sgd(params));
}

// One process training on every rank's rows at once: what DDP must reproduce.
// `optimizer`, if given, receives the optimizer it trained with.
template <typename Net>
Net train_reference(const DdpScenario& s, std::unique_ptr<torch::optim::Optimizer>* optimizer = nullptr) {
  torch::manual_seed(1);  // rank 0's initialisation, which DDP broadcasts
  Net model;
  std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer(s.optimizer, model->parameters());
  torch::optim::Optimizer& sgd = *opt;
  for (size_t step = 0; step < s.rows.size(); ++step) {
    sgd.zero_grad();
    for (int micro = 0; micro < (s.micro_batches ? 2 : 1); ++micro) {
      std::vector<at::Tensor> xs, outs, ys;
      const auto data = step_data(s, static_cast<int>(step), micro);
      for (int r = 0; r < s.world; ++r) {
        if (s.rows[step][r] == 0) continue;
        // Batch statistics must cover the whole batch: one forward on the concatenation.
        if (s.sync_bn) xs.push_back(data[r].first);
        if (!s.sync_bn) outs.push_back(model->forward(data[r].first, uses_extra(s, r)));
        ys.push_back(data[r].second);
      }
      if (s.sync_bn) outs.push_back(model->forward(at::cat(xs), true));
      (at::cross_entropy_loss(at::cat(outs), at::cat(ys)) * s.loss_scale).backward();
    }
    sgd.step();
  }
  if (optimizer) *optimizer = std::move(opt);
  return model;
}

}  // namespace datapar::testing
