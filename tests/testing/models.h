// Small clonable models for the parallel tests.
#pragma once

#include <torch/utils.h>               // torch::manual_seed
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "datapar/state_dict.h"

namespace datapar::testing {

// Linear, Conv2d, ReLU and pooling: (B, 1, 12, 12) -> (B, 10).
class ConvNetImpl : public torch::nn::Cloneable<ConvNetImpl> {
 public:
  ConvNetImpl() { reset(); }
  void reset() override {
    namespace nn = torch::nn;
    net = register_module(
        "net", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)), nn::ReLU(),  // (B, 4, 12, 12)
                              nn::MaxPool2d(2),                                               // (B, 4, 6, 6)
                              nn::Conv2d(4, 8, 3), nn::ReLU(),                                // (B, 8, 4, 4)
                              nn::AvgPool2d(2), nn::Flatten(),                                // (B, 32)
                              nn::Linear(32, 16), nn::ReLU(), nn::Linear(16, 10)));
  }
  at::Tensor forward(const at::Tensor& x) { return net->forward(x); }
  torch::nn::Sequential net{nullptr};
};
TORCH_MODULE(ConvNet);

// Linear -> BatchNorm1d -> ReLU -> Linear: (B, 6) -> (B, 3).
class BnNetImpl : public torch::nn::Cloneable<BnNetImpl> {
 public:
  BnNetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(6, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(BnNet);

// Several arguments in, a tuple out; throws for chunks smaller than min_rows.
class TwoHeadsImpl : public torch::nn::Cloneable<TwoHeadsImpl> {
 public:
  explicit TwoHeadsImpl(int64_t min_rows = 0) : min_rows(min_rows) { reset(); }
  void reset() override {
    a = register_module("a", torch::nn::Linear(4, 2));
    b = register_module("b", torch::nn::Linear(3, 2));
    unused = register_module("unused", torch::nn::Linear(2, 2));
  }
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& y, double scale) {
    if (x.size(0) < min_rows) throw std::runtime_error("chunk too small: " + std::to_string(x.size(0)) + " rows");
    return {a(x) * scale, a(x) + b(y)};
  }
  int64_t min_rows;
  torch::nn::Linear a{nullptr}, b{nullptr}, unused{nullptr};
};
TORCH_MODULE(TwoHeads);

// Records which threads run its backward.
struct ThreadLog {
  std::mutex mutex;
  std::set<std::thread::id> backward_threads;
};

class ThreadProbeImpl : public torch::nn::Cloneable<ThreadProbeImpl> {
 public:
  explicit ThreadProbeImpl(std::shared_ptr<ThreadLog> log = std::make_shared<ThreadLog>()) : log(std::move(log)) {
    reset();
  }
  void reset() override { fc = register_module("fc", torch::nn::Linear(5, 2)); }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = fc(x);
    auto shared_log = log;
    y.register_hook([shared_log](const at::Tensor& g) {
      std::lock_guard<std::mutex> lock(shared_log->mutex);
      shared_log->backward_threads.insert(std::this_thread::get_id());
      return g;
    });
    return y;
  }
  std::shared_ptr<ThreadLog> log;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ThreadProbe);

// |a - b| / |b| over the whole tensor: the relative error the tests bound.
// A ConvNet with `source`'s parameters and buffers, sharing none of its tensors.
inline ConvNet copy_of(const ConvNet& source) {
  ConvNet copy;
  load_state_dict(*copy, state_dict(*source));
  return copy;
}

inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double denom = b.norm().item<double>();
  return (a - b).norm().item<double>() / (denom > 0 ? denom : 1.0);
}

}  // namespace datapar::testing
