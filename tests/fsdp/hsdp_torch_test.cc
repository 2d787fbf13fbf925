// datapar's hybrid sharding against PyTorch 2.15's (fully_shard on a (2, 2) device mesh,
// gloo; tests/fsdp/torch_hsdp_twin.py): the same model, initialisation and data on 4 ranks,
// 2 machines of 2, 20 steps of SGD with momentum in float32; the final models agree within
// 1e-5 (relative).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <string>

#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/fsdp/hybrid_groups.h"
#include "datapar/state_dict.h"
#include "testing/fsdp_net.h"
#include "testing/hybrid_ranks.h"
#include "testing/python.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace hsdp_torch_test {

TEST(HsdpAgainstPyTorch, TwoByTwoTrainsAsFullyShardOnATwoByTwoMesh) {
  DATAPAR_REQUIRE_PYTORCH_215();
  constexpr int kSteps = 20;  // torch_hsdp_twin.py's STEPS
  const testing::TempDir dir("hsdp_torch");
  const std::string init = dir.path() + "/init.pt", theirs = dir.path() + "/torch.pt";
  torch::manual_seed(11);
  testing::FsdpNet initial;
  save_state_dict(state_dict(*initial), init);
  const std::string command = "'" + testing::pytorch215_python() + "' '" DATAPAR_SOURCE_DIR
                              "/tests/fsdp/torch_hsdp_twin.py' '" + init + "' '" + theirs + "' '" + dir.path() +
                              "/rendezvous'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const StateDict want = load_state_dict_file(theirs);

  testing::run_hybrid_ranks(4, /*shard_size=*/2, [&](int rank, const HybridGroups& groups) {
    testing::FsdpNet model;  // rank 0's values reach every rank when the units are made
    if (rank == 0) load_state_dict(*model, load_state_dict_file(init));
    FsdpOptions options;
    options.replicate_group = groups.replicate;
    fully_shard_each<torch::nn::LinearImpl>(*model->blocks, groups.shard, options);
    FullyShardedDataParallel fsdp(model, groups.shard, options);
    torch::optim::SGD sgd(fsdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      sgd.zero_grad();
      fsdp.forward(testing::fsdp_batch(rank, step, at::kFloat)).pow(2).mean().backward();
      sgd.step();
    }
    const StateDict got = fsdp.full_state_dict();
    ASSERT_EQ(got.keys(), want.keys());
    for (const auto& item : want) {
      EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-5, 1e-6))
          << "rank " << rank << ": " << item.key() << " differs from PyTorch's by "
          << (got[item.key()] - item.value()).abs().max().item<double>();
    }
  });
}

}  // namespace hsdp_torch_test
}  // namespace datapar
