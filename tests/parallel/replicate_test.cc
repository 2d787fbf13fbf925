#include "datapar/parallel/replicate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/models.h"

namespace datapar {
namespace {

using testing::BnNet;
using testing::ConvNet;

TEST(Replicate, CpuReplicasAreSeparateLeavesOverTheMastersStorage) {
  ConvNet master;
  auto replicas = replicate(master, cpu_devices(3));
  ASSERT_EQ(replicas.size(), 3u);
  const auto master_params = master->parameters();
  for (const auto& replica : replicas) {
    const auto params = replica->parameters();
    ASSERT_EQ(params.size(), master_params.size());
    for (size_t j = 0; j < params.size(); ++j) {
      EXPECT_TRUE(params[j].is_leaf());
      EXPECT_TRUE(params[j].requires_grad());
      EXPECT_FALSE(params[j].is_same(master_params[j]));               // its own leaf...
      EXPECT_EQ(params[j].data_ptr(), master_params[j].data_ptr());    // ...over the same memory
    }
  }
  EXPECT_EQ(replicas.set().parameter_copies(), 0);
}

TEST(Replicate, ReplicasSeeMasterUpdatesWithoutCopies) {
  ConvNet master;
  auto replicas = replicate(master, cpu_devices(2));
  {
    at::NoGradGuard no_grad;
    for (auto& p : master->parameters()) p.add_(1.0);  // what an optimizer step does
  }
  replicas.set().refresh();
  EXPECT_TRUE(at::equal(replicas[1]->parameters()[0], master->parameters()[0]));
  EXPECT_EQ(replicas.set().parameter_copies(), 0);
}

TEST(Replicate, FollowsTrainEvalModeAndBuffers) {
  BnNet master;
  auto replicas = replicate(master, cpu_devices(2));
  master->eval();
  {
    at::NoGradGuard no_grad;
    master->bn->running_mean.fill_(3.0);
  }
  replicas.set().refresh();
  for (const auto& r : replicas) {
    EXPECT_FALSE(r->is_training());
    EXPECT_FALSE(r->bn->is_training());
    EXPECT_TRUE(at::equal(r->bn->running_mean, master->bn->running_mean));
  }
  // The first replica shares the master's buffers; the others have their own copies.
  EXPECT_EQ(replicas[0]->bn->running_mean.data_ptr(), master->bn->running_mean.data_ptr());
  EXPECT_NE(replicas[1]->bn->running_mean.data_ptr(), master->bn->running_mean.data_ptr());
}

TEST(Replicate, LeavesTheRandomStreamAlone) {
  ConvNet master;
  const auto state = at::detail::getDefaultCPUGenerator().get_state();
  auto replicas = replicate(master, cpu_devices(4));
  EXPECT_TRUE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), state));
}

struct NotClonable : torch::nn::Module {
  NotClonable() { register_parameter("w", at::ones({2})); }
};

TEST(Replicate, RejectsWhatItCannotReplicate) {
  EXPECT_THROW_MSG(replicate(std::make_shared<NotClonable>(), cpu_devices(2)), InvalidArgumentError,
                   "torch::nn::Cloneable");
  EXPECT_THROW_MSG(replicate(ConvNet(), std::vector<Device>{}), InvalidArgumentError, "no devices");
}

}  // namespace
}  // namespace datapar
