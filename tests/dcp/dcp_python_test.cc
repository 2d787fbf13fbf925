// torch.distributed.checkpoint between datapar and PyTorch 2.15 (tests/dcp/dcp_interop.py),
// both ways, and a rank killed in the middle of a save (real processes).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "child_process.h"
#include "datapar/dcp/checkpoint.h"
#include "datapar/dcp/fsdp_state.h"
#include "datapar/dcp/zero_state.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/error.h"
#include "datapar/fsdp/fully_shard.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/state_dict.h"
#include "datapar/optim/optimizer_state.h"
#include "file_system.h"
#include "testing/dcp_twin.h"
#include "testing/gloo_ranks.h"
#include "testing/python.h"
#include "testing/temp_dir.h"

#ifndef DATAPAR_DCP_PYTHON
#error "tests/CMakeLists.txt defines DATAPAR_DCP_PYTHON, PyTorch 2.15's Python for the DCP interop tests"
#endif

namespace datapar {
namespace {

using namespace std::chrono_literals;

using testing::pytorch215_python;

int interop(const std::string& args) {
  const std::string command = "'" + pytorch215_python() + "' '" DATAPAR_SOURCE_DIR "/tests/dcp/dcp_interop.py' " + args;
  return std::system(command.c_str());
}

using testing::dcp_twin;
using testing::dcp_twin_step;

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got.to(at::kDouble), want.to(at::kDouble), 1e-5, 1e-6))
      << what << ": max difference " << (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
}

// PyTorch saves with 2 ranks (DDP, and FSDP2, whose parameters are row shards); datapar loads
// on 1, 2 and 3 ranks, and the next Adam step is PyTorch's.
TEST(DcpPython, DataparLoadsWhatPyTorchSavedOnOneTwoAndThreeRanks) {
  DATAPAR_REQUIRE_PYTORCH_215();
  const testing::TempDir dir("dcp");
  for (const std::string kind : {"ddp", "fsdp"}) {
    const std::string ck = dir.path() + "/" + kind;
    const std::string ref = ck + ".ref.pt";
    ASSERT_EQ(interop("save '" + ck + "' '" + ref + "' " + kind), 0);
    const StateDict want = load_state_dict_file(ref);
    for (int world : {1, 2, 3}) {
      testing::run_gloo_ranks(world, [&](int rank, std::shared_ptr<ProcessGroup> group) {
        const std::string where = kind + ", world " + std::to_string(world) + ", rank " + std::to_string(rank);
        torch::nn::Sequential model = dcp_twin(55);
        torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.5));
        dcp::State state;
        dcp::add_module(state, "model", *model);
        dcp::add_optimizer(state, "optim", adam, *model);
        state.put("progress.epoch", c10::IValue());
        state.put("progress.step", c10::IValue());
        // This rank's rows of the first layer's weight, resharded from PyTorch's boxes.
        const int64_t rows = (8 + world - 1) / world;
        const int64_t begin = std::min<int64_t>(8, rank * rows);
        const int64_t count = std::min<int64_t>(8 - begin, rows);
        dcp::State shard;
        shard.put("model.0.weight", dcp::Shard{at::zeros({count, 6}), {begin, 0}, {8, 6}});
        dcp::load(state, ck, *group);
        dcp::load(shard, ck, *group);
        dcp::apply_optimizer(state, "optim", adam, *model);
        EXPECT_EQ(state.at("progress.epoch").value.toInt(), 3) << where;
        EXPECT_EQ(state.at("progress.step").value.toInt(), 17) << where;
        expect_close(shard.tensor("model.0.weight"), want["model.0.weight"].narrow(0, begin, count), where);
        for (const auto& p : state_dict(*model))
          expect_close(p.value(), want["model." + p.key()], where + " " + p.key());
        const auto osd = optimizer_state_dict(adam);
        const auto names = model->named_parameters();
        for (const auto& s : osd.at("state").toGenericDict()) {
          const std::string name = names[static_cast<size_t>(s.key().toInt())].key();
          for (const auto& kv : s.value().toGenericDict()) {
            const std::string key = "optim.state." + name + "." + kv.key().toStringRef();
            expect_close(kv.value().toTensor(), want[key], where + " " + key);
          }
        }
        dcp_twin_step(model, adam, want["x2"]);
        for (const auto& p : state_dict(*model))
          expect_close(p.value(), want["after." + p.key()], where + " after a step");
      });
    }
  }
}

// datapar saves with 2 ranks, whole (DDP) and sharded (FSDP); PyTorch loads on 1 rank (DDP),
// on 2 (FSDP2: resharded into its row shards) and into one torch.save file
// (dcp_to_torch_save), and steps on from there.
TEST(DcpPython, PyTorchLoadsWhatDataparSaved) {
  DATAPAR_REQUIRE_PYTORCH_215();
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/ck";
  torch::manual_seed(5);
  const at::Tensor x = at::randn({5, 6});
  const at::Tensor x2 = at::randn({5, 6});
  testing::run_gloo_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(3);  // the same on both ranks, as under DDP
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
    dcp_twin_step(model, adam, x);
    dcp::State state;
    dcp::add_module(state, "model", *model);
    dcp::add_optimizer(state, "optim", adam, *model);
    state.put("progress.epoch", c10::IValue(int64_t{3}), {c10::IValue("progress"), c10::IValue("epoch")});
    state.put("progress.step", c10::IValue(int64_t{17}), {c10::IValue("progress"), c10::IValue("step")});
    dcp::save(state, ck, *group);
  });
  // What PyTorch must find, and its next step.
  torch::nn::Sequential model = dcp_twin(3);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  dcp_twin_step(model, adam, x);
  dcp::State state;
  dcp::add_module(state, "model", *model);
  dcp::add_optimizer(state, "optim", adam, *model);
  StateDict ref;
  for (const auto& e : state.entries()) {
    if (e.kind == dcp::State::Kind::kTensor) ref.insert(e.name, e.boxes.at(0).local.clone());
  }
  dcp_twin_step(model, adam, x2);
  ref.insert("x2", x2);
  for (const auto& p : state_dict(*model)) ref.insert("after." + p.key(), p.value().clone());
  save_state_dict(ref, dir.path() + "/ref.pt");
  EXPECT_EQ(interop("load '" + ck + "' '" + dir.path() + "/ref.pt' 1 ddp"), 0);
  EXPECT_EQ(interop("load '" + ck + "' '" + dir.path() + "/ref.pt' 2 fsdp"), 0);
  EXPECT_EQ(interop("convert '" + ck + "' '" + dir.path() + "/ref.pt'"), 0);

  // The same training under datapar's FSDP (each Linear a unit): each rank saves only its
  // shards' boxes, and PyTorch loads them the same ways.
  const std::string sharded = dir.path() + "/fsdp";
  testing::run_gloo_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(3);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    torch::optim::Adam adam(fsdp.parameters(), torch::optim::AdamOptions(0.01));
    adam.zero_grad();
    fsdp.forward(x).pow(2).mean().backward();
    adam.step();
    dcp::State state;
    dcp::add_fsdp(state, "model", fsdp);
    dcp::add_fsdp_optimizer(state, "optim", fsdp, adam);
    state.put("progress.epoch", c10::IValue(int64_t{3}), {c10::IValue("progress"), c10::IValue("epoch")});
    state.put("progress.step", c10::IValue(int64_t{17}), {c10::IValue("progress"), c10::IValue("step")});
    dcp::save(state, sharded, *group);
  });
  EXPECT_EQ(interop("load '" + sharded + "' '" + dir.path() + "/ref.pt' 1 ddp"), 0);
  EXPECT_EQ(interop("load '" + sharded + "' '" + dir.path() + "/ref.pt' 2 fsdp"), 0);

  // And under ZeRO-1: each parameter's Adam state written by its owner alone.
  const std::string zero_dir = dir.path() + "/zero";
  testing::run_gloo_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(3);
    ZeroRedundancyOptimizer zero(model->parameters(), [](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(std::move(p), torch::optim::AdamOptions(0.01));
    }, group);
    zero.zero_grad();
    model->forward(x).pow(2).mean().backward();
    zero.step();
    dcp::State state;
    dcp::add_module(state, "model", *model);
    dcp::add_zero_optimizer(state, "optim", zero, *model);
    state.put("progress.epoch", c10::IValue(int64_t{3}), {c10::IValue("progress"), c10::IValue("epoch")});
    state.put("progress.step", c10::IValue(int64_t{17}), {c10::IValue("progress"), c10::IValue("step")});
    dcp::save(state, zero_dir, *group);
  });
  EXPECT_EQ(interop("load '" + zero_dir + "' '" + dir.path() + "/ref.pt' 1 ddp"), 0);
  EXPECT_EQ(interop("load '" + zero_dir + "' '" + dir.path() + "/ref.pt' 2 fsdp"), 0);
}

std::optional<std::string> no_env(const std::string&) { return std::nullopt; }

// Rank 1 is killed (SIGKILL) while it writes its part of a 64 MiB save: rank 0 fails within
// the group's timeout instead of hanging, the directory has no .metadata (load says it is
// incomplete), and the checkpoint saved before loads.
TEST(DcpProcess, ARankKilledMidSaveLeavesThePreviousCheckpointLoadable) {
  const testing::TempDir dir("dcp");
  const std::string url = "file://" + dir.path() + "/store";
  const std::string before = dir.path() + "/step-1";
  const std::string cut = dir.path() + "/step-2";
  const auto start = std::chrono::steady_clock::now();
  const auto exits = detail::fork_ranks(
      2,
      [&](int rank) {
        Rendezvous rdzv = rendezvous(url, rank, 2, 30s, no_env);
        auto group = new_gloo_process_group(rdzv.store, rank, 2, {"127.0.0.1", 10s, false});
        dcp::State state;
        state.put("w", dcp::Shard{at::full({1024, 8192}, static_cast<double>(rank)), {rank * 1024, 0}, {2048, 8192}});
        dcp::save(state, before, *group);
        if (rank == 1) {
          std::thread([&] {  // dies once its data file of step-2 is being written
            while (true) {
              for (const std::string& name : detail::list_directory(cut)) {
                if (name.find("__1_0.distcp.tmp") != std::string::npos) ::raise(SIGKILL);
              }
              std::this_thread::sleep_for(1ms);
            }
          })
              .detach();
        }
        try {
          dcp::save(state, cut, *group);
          return 10;  // must not succeed without rank 1
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
          return 0;
        }
      },
      "dcp_kill_mid_save");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  EXPECT_EQ(exits[1].signal, SIGKILL);
  EXPECT_EQ(exits[0].exit_code, 0) << "10: the save succeeded without rank 1";
  EXPECT_FALSE(dcp::is_checkpoint(cut));
  EXPECT_FALSE(detail::exists(cut + "/.metadata"));
  testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    dcp::State state;
    state.put("w", at::zeros({2048, 8192}, at::kDouble));
    try {
      dcp::load(state, cut, *group);
      ADD_FAILURE() << "the cut save loaded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("an incomplete one"), std::string::npos) << e.what();
    }
    dcp::load(state, before, *group);
    EXPECT_EQ(state.tensor("w")[2047][0].item<double>(), 1.0);
    EXPECT_EQ(state.tensor("w")[0][8191].item<double>(), 0.0);
  });
}

}  // namespace
}  // namespace datapar
