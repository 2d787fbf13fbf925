// A user's FSDP program, as written from PyTorch habits (issue 51), run by `datapar launch`
// (fsdp_mistakes_test): a model with named members, each mistake left uncaught as a first
// program leaves it.
//   fsdp_mistake named        fully_shard on the named members, 3 steps of Adam, a checkpoint
//                             through FSDP: prints "trained" and exits 0
//   fsdp_mistake shard-twice  fully_shard(net->fc1) twice
//   fsdp_mistake wrap-twice   two FullyShardedDataParallel over one model
//   fsdp_mistake bare-module  the module's own forward after wrapping it
//   fsdp_mistake checkpoint   DDP's checkpoint recipe (make_checkpoint(*net, ...)) under FSDP
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <iostream>
#include <string>

#include "datapar/distributed.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/train/fsdp_checkpoint.h"

namespace {

using namespace datapar;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(fc1(x).relu()); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

}  // namespace

int main(int argc, char** argv) {
  const std::string mistake = argc > 1 ? argv[1] : "named";
  init_process_group("gloo");
  const int rank = default_group()->rank();
  torch::manual_seed(0);
  Net net;
  fully_shard(net->fc1);
  if (mistake == "shard-twice") fully_shard(net->fc1);
  fully_shard(net->fc2);
  FullyShardedDataParallel fsdp(net);
  if (mistake == "wrap-twice") FullyShardedDataParallel again(net);
  torch::optim::Adam adam(fsdp.parameters(), 1e-2);
  for (int step = 0; step < 3; ++step) {
    adam.zero_grad();
    fsdp.forward(at::randn({4, 5})).pow(2).mean().backward();
    adam.step();
  }
  if (mistake == "bare-module") std::cout << net->forward(at::randn({4, 5})) << "\n";
  if (mistake == "checkpoint") (void)train::make_checkpoint(*net, adam, 1);
  const train::Checkpoint checkpoint = train::make_checkpoint(fsdp, adam, 1);
  if (checkpoint.model.size() != 4) return 2;
  std::cout << "rank " << rank << ": trained, checkpoint of " << checkpoint.model.size() << " tensors\n";
  destroy_process_group();
  return 0;
}
