// The fault-tolerant tests' jobs of three member processes (tests/ft/): the membership
// options (fast heartbeats and eviction, two members at least), a member's connection to
// the test's store, and the small model and data every member trains.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include "datapar/ft/membership/options.h"
#include "datapar/rendezvous/tcp_store.h"

namespace datapar::testing {

inline ft::FtOptions three_member_options() {
  using namespace std::chrono_literals;
  ft::FtOptions o;
  o.heartbeat_interval = 100ms;
  o.eviction_timeout = 1000ms;
  o.settle_time = 300ms;
  o.quorum_timeout = 15s;
  o.expected_members = 3;
  o.min_members = 2;
  return o;
}

inline std::shared_ptr<TcpStore> connect_member(uint16_t port, const std::string& token) {
  using namespace std::chrono_literals;
  return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", port, false, token, 5s, ""});
}

// Under FSDP both Linears are units: the one in `blocks` bracketed, `head` sharded in place.
struct FtNet : torch::nn::Module {
  FtNet() {
    torch::manual_seed(7);  // the same initial parameters in every process
    blocks = register_module("blocks", torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh()));
    head = register_module("head", torch::nn::Linear(8, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return head->forward(blocks->forward(x)); }
  torch::nn::Sequential blocks{nullptr};
  torch::nn::Linear head{nullptr};
};

// `samples` rows of 6 inputs and 2 targets, the same in every process.
struct FtData {
  at::Tensor x, y;
  explicit FtData(int64_t samples) {
    at::Generator g = at::detail::createCPUGenerator(11);
    x = at::randn({samples, 6}, g);
    y = at::randn({samples, 2}, g);
  }
};

}  // namespace datapar::testing
