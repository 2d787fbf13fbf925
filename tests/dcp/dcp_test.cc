// torch.distributed.checkpoint in datapar (datapar/dcp/checkpoint.h): the .metadata reader
// and writer, saving and loading across world sizes with ranks as threads, and the errors
// for damaged, hostile and incomplete checkpoints. PyTorch's side: dcp_python_test.cc.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "datapar/dcp/checkpoint.h"
#include "datapar/dcp/fsdp_state.h"
#include "datapar/dcp/zero_state.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/error.h"
#include "datapar/fsdp/fully_shard.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/state_dict.h"
#include "datapar/optim/optimizer_state.h"
#include "dcp/metadata.h"
#include "file_system.h"  // not std::filesystem (src/file_system.h)
#include "testing/child.h"
#include "testing/dcp_twin.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using dcp::detail::Metadata;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

#define EXPECT_THAT_ERROR(error, substring)                                         \
  do {                                                                              \
    const std::string datapar_error_ = (error);                                     \
    EXPECT_NE(datapar_error_.find(substring), std::string::npos) << datapar_error_; \
  } while (0)

Metadata parse(const std::string& bytes) { return dcp::detail::parse_metadata(bytes.data(), bytes.size()); }

// A tensor of 7x3 in two row chunks, and a value.
Metadata two_chunks() {
  Metadata md;
  dcp::detail::Entry t;
  t.fqn = "model.w";
  t.is_tensor = true;
  t.dtype = at::kFloat;
  t.size = {7, 3};
  t.chunks = {{{0, 0}, {4, 3}}, {{4, 0}, {3, 3}}};
  t.storage = {{"__0_0.distcp", 0, 100}, {"__1_0.distcp", 0, 100}};
  t.path = {c10::IValue("model"), c10::IValue("w")};
  dcp::detail::Entry v;
  v.fqn = "progress.step";
  v.storage = {{"__1_0.distcp", 100, 50}};
  md.entries = {t, v};
  md.save_id = "abc";
  return md;
}

TEST(DcpMetadata, ReadsWhatItWrites) {
  const Metadata back = parse(dcp::detail::write_metadata(two_chunks(), "ck"));
  ASSERT_EQ(back.entries.size(), 2u);
  const auto& t = back.entries[0];
  EXPECT_EQ(t.fqn, "model.w");
  EXPECT_TRUE(t.is_tensor);
  EXPECT_EQ(t.size, (std::vector<int64_t>{7, 3}));
  ASSERT_EQ(t.chunks.size(), 2u);
  EXPECT_EQ(t.chunks[1].offsets, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(t.storage[1].relative_path, "__1_0.distcp");
  EXPECT_EQ(t.path.size(), 2u);
  EXPECT_FALSE(back.entries[1].is_tensor);
  EXPECT_EQ(back.entries[1].storage[0].offset, 100);
  EXPECT_EQ(back.save_id, "abc");
}

// What PyTorch 2.15's dcp.save wrote (fuzz/corpus/dcp_metadata: a DDP and an FSDP2 model
// with Adam, 2 ranks).
TEST(DcpMetadata, ReadsPyTorchsMetadata) {
  const Metadata fsdp =
      parse(read_file(DATAPAR_SOURCE_DIR "/fuzz/corpus/dcp_metadata/fsdp2_adam_pytorch_2_15.metadata"));
  const auto* w = fsdp.find("model.0.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->size, (std::vector<int64_t>{3, 5}));
  ASSERT_EQ(w->chunks.size(), 2u);  // FSDP2 shards rows: 2 + 1
  EXPECT_EQ(w->chunks[1].offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(w->chunks[1].sizes, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(w->path, (std::vector<c10::IValue>{c10::IValue("model"), c10::IValue("0.weight")}));
  const auto* step = fsdp.find("optim.state.0.weight.step");
  ASSERT_NE(step, nullptr);
  EXPECT_TRUE(step->size.empty());
  const auto* lr = fsdp.find("optim.param_groups.0.lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_FALSE(lr->is_tensor);
  const Metadata ddp = parse(read_file(DATAPAR_SOURCE_DIR "/fuzz/corpus/dcp_metadata/ddp_adam_pytorch_2_15.metadata"));
  EXPECT_EQ(ddp.find("model.2.bias")->chunks.size(), 1u);
  EXPECT_EQ(ddp.find("progress.epoch")->storage.size(), 1u);
}

TEST(DcpMetadata, RefusesWhatNoCheckpointHolds) {
  struct Case {
    const char* what;
    void (*damage)(Metadata&);
    const char* message;
  };
  const Case cases[] = {
      {"overlap",
       [](Metadata& m) {
         m.entries[0].chunks[1].offsets = {3, 0};
       },
       "overlapping chunks at [3, 0] and [0, 0]"},
      {"outside",
       [](Metadata& m) {
         m.entries[0].chunks[1].sizes = {4, 3};
       },
       "that is not inside it"},
      {"gap",
       [](Metadata& m) {
         m.entries[0].chunks[1].sizes = {2, 3};
       },
       "chunks covering 18 (a part is missing)"},
      {"escape", [](Metadata& m) { m.entries[0].storage[0].relative_path = "../../etc/passwd"; },
       "not a file name inside the checkpoint"},
      {"negative", [](Metadata& m) { m.entries[1].storage[0].offset = -5; }, "is stored at offset -5"},
      {"dims", [](Metadata& m) { m.entries[0].chunks[0].offsets = {0}; }, "that is not inside it"},
      {"huge",
       [](Metadata& m) {
         m.entries[0].size = {int64_t{1} << 40, int64_t{1} << 40};
       },
       "past 2^62 elements"},
  };
  for (const Case& c : cases) {
    Metadata md = two_chunks();
    c.damage(md);
    SCOPED_TRACE(c.what);
    EXPECT_THROW_MSG(parse(dcp::detail::write_metadata(md, "ck")), CheckpointError, c.message);
  }
  // A version datapar does not know, and every truncation of a good file: an error, never a crash.
  std::string good = dcp::detail::write_metadata(two_chunks(), "ck");
  std::string other = good;
  other.replace(other.find("1.0.0"), 5, "9.9.9");
  EXPECT_THROW_MSG(parse(other), CheckpointError, "DCP format version is \"9.9.9\"; datapar reads version 1.0.0");
  for (size_t n = 0; n < good.size(); n += 7) EXPECT_THROW(parse(good.substr(0, n)), CheckpointError) << n;
  // Code instead of data.
  const char evil_bytes[] =
      "\x80\x02"
      "cos\nsystem\n"
      "(X\x02\x00\x00\x00"
      "ls"
      "tR.";
  const std::string evil(evil_bytes, sizeof evil_bytes - 1);
  EXPECT_THROW_MSG(parse(evil), CheckpointError, "calls os.system, which datapar does not read");
  const char object_bytes[] =
      "\x80\x02"
      "cbuiltins\nobject\n"
      ")\x81"
      ".";
  const std::string object(object_bytes, sizeof object_bytes - 1);
  EXPECT_THROW_MSG(parse(object), CheckpointError, "builds a builtins.object, which datapar does not read");
}

// A whole tensor, a tensor in row shards and a value, saved by 2 ranks and loaded by 1, 2 and
// 3, each time in other boxes (columns at 3).
TEST(Dcp, SavedByTwoRanksLoadsOnOneTwoOrThree) {
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/ck";
  const at::Tensor whole = at::arange(12, at::kDouble).reshape({3, 4});
  const at::Tensor sharded = at::arange(70, at::kFloat).reshape({7, 10});
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    dcp::State state;
    state.put("whole", whole.clone());
    const int64_t begin = rank == 0 ? 0 : 4;
    state.put("sharded", dcp::Shard{sharded.narrow(0, begin, rank == 0 ? 4 : 3).clone(), {begin, 0}, {7, 10}});
    state.put("progress.step", c10::IValue(int64_t{17}));
    dcp::save(state, ck, *group);
  });
  EXPECT_TRUE(dcp::is_checkpoint(ck));
  struct stat st {};
  EXPECT_EQ(::stat((ck + "/__1_0.distcp").c_str(), &st), 0) << "each rank writes its own shard";
  for (int world : {1, 2, 3}) {
    testing::run_gloo_ranks(world, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      dcp::State state;
      state.put("whole", at::zeros({3, 4}, at::kDouble));
      const int64_t width = (10 + world - 1) / world;
      const int64_t begin = std::min<int64_t>(10, rank * width);
      const int64_t columns = std::min<int64_t>(10 - begin, width);
      state.put("sharded", dcp::Shard{at::zeros({7, columns}, at::kDouble), {0, begin}, {7, 10}});
      state.put("progress.step", c10::IValue());
      dcp::load(state, ck, *group);
      EXPECT_TRUE(at::equal(state.tensor("whole"), whole)) << world;
      EXPECT_TRUE(at::equal(state.tensor("sharded"), sharded.narrow(1, begin, columns).to(at::kDouble)))
          << "world " << world << " rank " << rank;
      EXPECT_EQ(state.at("progress.step").value.toInt(), 17);
    });
  }
}

using testing::dcp_twin;
using testing::dcp_twin_step;

// A model and Adam saved by 2 ranks and loaded by 3 continue exactly where they were.
TEST(Dcp, ModelAndAdamContinueAtAnotherWorldSize) {
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/ck";
  torch::manual_seed(7);
  const at::Tensor x = at::randn({5, 6});
  const at::Tensor x2 = at::randn({5, 6});
  torch::nn::Sequential reference = dcp_twin(0);
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(0.01));
  dcp_twin_step(reference, reference_adam, x);
  dcp_twin_step(reference, reference_adam, x);
  testing::run_gloo_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(0);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
    dcp_twin_step(model, adam, x);
    dcp::State state;
    dcp::add_module(state, "model", *model);
    dcp::add_optimizer(state, "optim", adam, *model);
    dcp::save(state, ck, *group);
  });
  dcp_twin_step(reference, reference_adam, x2);  // the third step, taken after loading below
  const auto names = dcp::saved_entries(ck);
  EXPECT_EQ(names.front().name, "model.0.weight");
  testing::run_gloo_ranks(3, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(99);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.5));  // lr comes from the checkpoint
    dcp::State state;
    dcp::add_module(state, "model", *model);
    dcp::add_optimizer(state, "optim", adam, *model);
    dcp::load(state, ck, *group);
    dcp::apply_optimizer(state, "optim", adam, *model);
    EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options()).lr(), 0.01);
    dcp_twin_step(model, adam, x);   // the second step
    dcp_twin_step(model, adam, x2);  // the third
    const StateDict got = state_dict(*model);
    for (const auto& item : state_dict(*reference)) {
      EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-6, 1e-7)) << item.key();
    }
  });
}

// The boxes of a flat range: a part row, whole rows, a part row (3-d: part rows of part planes).
TEST(Dcp, FlatRangeBoxesAreContiguousAndCoverTheRange) {
  const std::vector<int64_t> sizes = {3, 4, 5};
  for (int64_t begin = 0; begin <= 60; begin += 7) {
    for (int64_t end = begin; end <= 60; end += 5) {
      int64_t at = begin;
      for (const dcp::Shard& box : dcp::flat_range_boxes(sizes, begin, end)) {
        const int64_t start = box.offsets[0] * 20 + box.offsets[1] * 5 + box.offsets[2];
        EXPECT_EQ(start, at) << begin << ".." << end;
        at += box.global_size[0] * box.global_size[1] * box.global_size[2];
      }
      EXPECT_EQ(at, end) << begin << ".." << end;
    }
  }
  EXPECT_EQ(dcp::flat_range_boxes(sizes, 7, 53).size(), 5u);  // part row, rows, plane, rows, part row
}

// FSDP's flat shards saved as boxes by 2 ranks load into FSDP at 3 ranks and into a whole
// model on 1, and the next Adam step is one process's.
TEST(Dcp, FsdpShardsLoadAtAnotherWorldSizeOrWhole) {
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/ck";
  torch::manual_seed(11);
  const at::Tensor x = at::randn({5, 6});
  const at::Tensor x2 = at::randn({5, 6});
  torch::nn::Sequential reference = dcp_twin(0);
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(0.01));
  dcp_twin_step(reference, reference_adam, x);
  dcp_twin_step(reference, reference_adam, x2);
  const StateDict want = state_dict(*reference);
  testing::run_gloo_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(0);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    torch::optim::Adam adam(fsdp.parameters(), torch::optim::AdamOptions(0.01));
    adam.zero_grad();
    fsdp.forward(x).pow(2).mean().backward();
    adam.step();
    dcp::State state;
    dcp::add_fsdp(state, "model", fsdp);
    dcp::add_fsdp_optimizer(state, "optim", fsdp, adam);
    EXPECT_GE(state.at("model.0.weight").boxes.size(), 1u);
    dcp::save(state, ck, *group);
  });
  struct stat st {};
  ASSERT_EQ(::stat((ck + "/__1_0.distcp").c_str(), &st), 0);
  EXPECT_GT(st.st_size, 0) << "each rank writes its own shards";
  testing::run_gloo_ranks(3, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(99);
    fully_shard_each<torch::nn::LinearImpl>(*model, group);
    FullyShardedDataParallel fsdp(model, group);
    torch::optim::Adam adam(fsdp.parameters(), torch::optim::AdamOptions(0.5));
    dcp::State state;
    dcp::add_fsdp(state, "model", fsdp);
    dcp::add_fsdp_optimizer(state, "optim", fsdp, adam);
    dcp::load(state, ck, *group);
    dcp::apply_fsdp_optimizer(state, "optim", fsdp, adam);
    adam.zero_grad();
    fsdp.forward(x2).pow(2).mean().backward();
    adam.step();
    const StateDict got = fsdp.full_state_dict();
    for (const auto& item : want) EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-5, 1e-6)) << item.key();
  });
  testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(98);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.5));
    dcp::State state;
    dcp::add_module(state, "model", *model);
    dcp::add_optimizer(state, "optim", adam, *model);
    dcp::load(state, ck, *group);
    dcp::apply_optimizer(state, "optim", adam, *model);
    dcp_twin_step(model, adam, x2);
    const StateDict got = state_dict(*model);
    for (const auto& item : want) EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-5, 1e-6)) << item.key();
  });
}

// ZeRO-1's state saved by each owner (2 ranks, nothing gathered) loads under ZeRO at 3 ranks,
// whose owners differ, and into a whole Adam in one process; both continue as one process
// would, with the learning rate a schedule set after the first step.
TEST(Dcp, ZeroStateSavedByItsOwnersLoadsAtAnotherWorldSizeAndWhole) {
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/ck";
  torch::manual_seed(13);
  const at::Tensor x = at::randn({5, 6});
  const at::Tensor x2 = at::randn({5, 6});
  auto adam = [](double lr) {
    return [lr](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<torch::optim::Adam>(std::move(p), torch::optim::AdamOptions(lr));
    };
  };
  auto set_lr = [](torch::optim::Optimizer& o, double lr) {
    static_cast<torch::optim::AdamOptions&>(o.param_groups()[0].options()).lr(lr);
  };
  torch::nn::Sequential reference = dcp_twin(0);
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(0.01));
  dcp_twin_step(reference, reference_adam, x);
  set_lr(reference_adam, 0.02);
  dcp_twin_step(reference, reference_adam, x2);
  const StateDict want = state_dict(*reference);
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(0);
    ZeroRedundancyOptimizer zero(model->parameters(), adam(0.01), group);
    zero.zero_grad();
    model->forward(x).pow(2).mean().backward();  // the same batch on each rank: no DDP needed
    zero.step();
    set_lr(*zero.shard_optimizer(), 0.02);
    dcp::State state;
    dcp::add_module(state, "model", *model);
    dcp::add_zero_optimizer(state, "optim", zero, *model);
    for (size_t i = 0; i < zero.parameters().size(); ++i) {
      const std::string name = state.entries()[i].name.substr(6);  // the module's entries come first
      EXPECT_EQ(state.at("optim.state." + name + ".exp_avg").boxes.size(), zero.owner(i) == rank ? 1u : 0u) << name;
    }
    dcp::save(state, ck, *group);
  });
  for (const dcp::SavedEntry& e : dcp::saved_entries(ck)) {
    if (e.name == "optim.state.0.weight.step") EXPECT_TRUE(e.size.empty()) << "Adam's step is a 0-d tensor";
  }
  struct stat st {};
  for (const char* file : {"/__0_0.distcp", "/__1_0.distcp"}) {
    ASSERT_EQ(::stat((ck + file).c_str(), &st), 0) << file;
    EXPECT_GT(st.st_size, 0) << file << ": each owner writes its own state";
  }
  testing::run_gloo_ranks(3, [&](int, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Sequential model = dcp_twin(99);
    ZeroRedundancyOptimizer zero(model->parameters(), adam(0.5), group);
    dcp::State state;
    dcp::add_module(state, "model", *model);
    dcp::add_zero_optimizer(state, "optim", zero, *model);
    dcp::load(state, ck, *group);
    dcp::apply_zero_optimizer(state, "optim", zero, *model);
    if (zero.shard_optimizer() != nullptr) {
      EXPECT_DOUBLE_EQ(
          static_cast<torch::optim::AdamOptions&>(zero.shard_optimizer()->param_groups()[0].options()).lr(), 0.02);
    }
    zero.zero_grad();
    model->forward(x2).pow(2).mean().backward();
    zero.step();
    const StateDict got = state_dict(*model);
    for (const auto& item : want) EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-6, 1e-7)) << item.key();
  });
  torch::nn::Sequential model = dcp_twin(98);
  torch::optim::Adam whole(model->parameters(), torch::optim::AdamOptions(0.5));
  dcp::State state;
  dcp::add_module(state, "model", *model);
  dcp::add_optimizer(state, "optim", whole, *model);
  dcp::load(state, ck);
  dcp::apply_optimizer(state, "optim", whole, *model);
  dcp_twin_step(model, whole, x2);
  const StateDict got = state_dict(*model);
  for (const auto& item : want) EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-6, 1e-7)) << item.key();
}

// More ranks than parameters: a rank that owns nothing saves no state and still agrees on the
// hyperparameters, which are the owners' (it has only the factory's); a checkpoint of a whole
// SGD (DDP's, one process) loads under ZeRO, and ZeRO's loads back into a whole SGD.
TEST(Dcp, ZeroRanksOwningNothingSaveTheOwnersHyperparameters) {
  const testing::TempDir dir("dcp");
  torch::manual_seed(17);
  const at::Tensor x = at::randn({5, 4});
  auto make = [] {
    torch::manual_seed(3);
    return torch::nn::Linear(4, 3);  // two parameters
  };
  auto sgd = [](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(std::move(p), torch::optim::SGDOptions(0.1).momentum(0.9));
  };
  auto step = [&](torch::nn::Linear& model, auto& optimizer) {
    optimizer.zero_grad();
    model->forward(x).pow(2).mean().backward();
    optimizer.step();
  };
  torch::nn::Linear reference = make();
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  step(reference, reference_sgd);
  dcp::State whole_state;
  dcp::add_module(whole_state, "model", *reference);
  dcp::add_optimizer(whole_state, "optim", reference_sgd, *reference);
  dcp::save(whole_state, dir.path() + "/whole");  // DDP's checkpoint: one whole SGD
  static_cast<torch::optim::SGDOptions&>(reference_sgd.param_groups()[0].options()).lr(0.05);
  step(reference, reference_sgd);
  const StateDict want = state_dict(*reference);

  std::mutex make_one_at_a_time;
  testing::run_gloo_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::nn::Linear model = nullptr;
    {
      const std::lock_guard<std::mutex> lock(make_one_at_a_time);
      model = make();
    }
    ZeroRedundancyOptimizer zero(model->parameters(), sgd, group);
    EXPECT_EQ(zero.shard_optimizer() == nullptr, rank == 2) << "parameters go to ranks 0 and 1";
    dcp::State state;
    dcp::add_module(state, "model", *model);
    dcp::add_zero_optimizer(state, "optim", zero, *model);
    dcp::load(state, dir.path() + "/whole", *group);
    dcp::apply_zero_optimizer(state, "optim", zero, *model);
    if (zero.shard_optimizer() != nullptr) {
      static_cast<torch::optim::SGDOptions&>(zero.shard_optimizer()->param_groups()[0].options()).lr(0.05);
    }
    zero.zero_grad();
    model->forward(x).pow(2).mean().backward();
    zero.step();
    dcp::State again;
    dcp::add_module(again, "model", *model);
    dcp::add_zero_optimizer(again, "optim", zero, *model);
    if (rank == 2) EXPECT_TRUE(again.at("optim.state.weight.momentum_buffer").boxes.empty());
    EXPECT_DOUBLE_EQ(again.at("optim.param_groups.0.lr").value.toDouble(), 0.05) << "rank " << rank;
    dcp::save(again, dir.path() + "/zero", *group);
  });
  const dcp::State saved = dcp::load_all(dir.path() + "/zero");
  EXPECT_DOUBLE_EQ(saved.at("optim.param_groups.0.lr").value.toDouble(), 0.05) << "the owners' rate, not the factory's";
  EXPECT_EQ(saved.at("optim.param_groups.0.params").value.toListRef().size(), 2u);
  torch::nn::Linear model(4, 3);
  // A momentum of its own (any but 0), so that it has momentum buffers to load into.
  torch::optim::SGD whole(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.1));
  dcp::State state;
  dcp::add_module(state, "model", *model);
  dcp::add_optimizer(state, "optim", whole, *model);
  dcp::load(state, dir.path() + "/zero");
  dcp::apply_optimizer(state, "optim", whole, *model);
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::SGDOptions&>(whole.param_groups()[0].options()).momentum(), 0.9);
  const StateDict got = state_dict(*model);
  for (const auto& item : want) EXPECT_TRUE(at::allclose(got[item.key()], item.value(), 1e-6, 1e-7)) << item.key();
  step(model, whole);
  step(reference, reference_sgd);
  const StateDict next = state_dict(*model);
  for (const auto& item : state_dict(*reference)) {
    EXPECT_TRUE(at::allclose(next[item.key()], item.value(), 1e-6, 1e-7)) << "momentum " << item.key();
  }
}

TEST(Dcp, RefusesAnExistingCheckpointRanksThatDisagreeAndWhatDoesNotFit) {
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/ck";
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    dcp::State state;
    state.put("w", at::ones({2, 2}));
    dcp::save(state, ck, *group);
    EXPECT_THROW_MSG(dcp::save(state, ck, *group), CheckpointError,
                     "holds a checkpoint already; save each checkpoint into a new directory");
    dcp::State other;
    other.put(rank == 0 ? "w" : "v", at::ones({2, 2}));
    EXPECT_THROW_MSG(dcp::save(other, dir.path() + "/ck2", *group), InvalidArgumentError,
                     "the ranks' states differ: entry 0 is w on rank 0 but v on rank 1");
    dcp::State bigger;
    bigger.put("w", at::ones({3, 2}));
    EXPECT_THROW_MSG(dcp::load(bigger, ck, *group), CheckpointError,
                     "w has size [2, 2] in the checkpoint but [3, 2] here");
    dcp::State missing;
    missing.put("u", at::ones({1}));
    EXPECT_THROW_MSG(dcp::load(missing, ck, *group), CheckpointError, "u is not in the checkpoint");
    dcp::load(missing, ck, *group, /*allow_partial=*/true);
    // One rank's failure is every rank's error.
    dcp::State fine;
    fine.put("w", at::ones({2, 2}));
    EXPECT_THROW_MSG(dcp::load(rank == 0 ? fine : bigger, ck, *group), CheckpointError, "rank 1: w has size");
  });
}

// The resident memory `bytes` of the program's own become under this build's sanitizer, of
// which `written` are written through its interceptors (read(), memcpy): AddressSanitizer keeps
// freed blocks (up to 256 MiB) in quarantine and pads each (3x in all); ThreadSanitizer maps
// shadow memory for what its interceptors write (as much again).
int64_t sanitizer_memory(int64_t bytes, int64_t written) {
#if defined(__SANITIZE_ADDRESS__)
  return 3 * bytes;
#elif defined(__SANITIZE_THREAD__)
  return bytes + written;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return 3 * bytes;
#elif __has_feature(thread_sanitizer)
  return bytes + written;
#endif
#endif
  (void)written;
  return bytes;
}

// Issue 46, Note [What a load costs]: a load holds the tensors the checkpoint names (each
// byte read once) and, while it reads one item, at most that item again (three times, before
// issue 50): measured in a child, 96 MiB of tensors in six items load within 96 + 16 MiB and
// the runtime's own.
TEST(Dcp, ALoadCostsAtMostTheTensorsItNamesAndItsLargestItem) {
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/ck";
  constexpr int64_t kItem = int64_t{16} << 20, kItems = 6;
  {
    dcp::State state;
    for (int i = 0; i < kItems; ++i) state.put("w" + std::to_string(i), at::full({kItem / 4}, float(i)));
    dcp::save(state, ck);
  }
  const testing::ChildOutcome r = testing::run_in_child(
      [&] {
        // This process's OpenMP pool ran (at::full above); libgomp is not fork-safe, and a
        // child's first parallel region would wait for the parent's threads for ever.
        at::set_num_threads(1);
        const dcp::State loaded = dcp::load_all(ck);
        double sum = 0;
        for (int i = 0; i < kItems; ++i) sum += loaded.tensor("w" + std::to_string(i))[0].item<double>();
        return std::to_string(static_cast<int64_t>(sum));
      },
      /*limit_seconds=*/60);
  ASSERT_TRUE(r.exited) << "ended by signal " << r.signal;
  EXPECT_EQ(r.message, "15");
  // The stated bound, and 32 MiB for the allocator's and Torch's own first use, and what a
  // sanitizer adds (sanitizer_memory).
  EXPECT_LT(r.memory_growth, sanitizer_memory(kItems * kItem + kItem + (int64_t{32} << 20), kItems * kItem));
}

// Issue 50, Note [A chunk read into its box]: a load into tensors that are its chunks' boxes
// (a DDP model resuming) reads each chunk straight into its tensor: measured in a child, a
// 128 MiB tensor loads with no second buffer of its size (before, three: its archive's
// bytes, the record, the tensor made of it). The same checkpoint into a box that takes part
// of a chunk, and into one of another dtype, still loads through a tensor of its own.
TEST(Dcp, ALoadIntoTheChunksOwnBoxesAllocatesNoneOfTheirBytes) {
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/ck";
  constexpr int64_t kBytes = int64_t{128} << 20;
  {
    dcp::State state;
    state.put("w", at::arange(kBytes / 4, at::kFloat).view({kBytes / 4 / 1024, 1024}));
    state.put("b", at::full({7}, 2.5));
    dcp::save(state, ck);
  }
  // Resident before the fork, so that the child's writes into it add nothing to its peak.
  at::Tensor w = at::full({kBytes / 4 / 1024, 1024}, -1.0f);
  at::Tensor b = at::zeros({7});
  const testing::ChildOutcome r = testing::run_in_child(
      [&] {
        at::set_num_threads(1);
        const void* before = w.data_ptr();
        dcp::State state;
        state.put("w", w);
        state.put("b", b);
        dcp::load(state, ck);
        const bool same = state.tensor("w").data_ptr() == before && w.data_ptr() == before;
        return std::string(same ? "same " : "moved ") + std::to_string(w[5][7].item<double>()) + " " +
               std::to_string(b[6].item<double>());
      },
      /*limit_seconds=*/60);
  ASSERT_TRUE(r.exited) << "ended by signal " << r.signal;
  EXPECT_EQ(r.message, "same 5127.000000 2.500000");
  EXPECT_LT(r.memory_growth, sanitizer_memory(int64_t{48} << 20, kBytes))
      << "the load held another buffer of the tensor's size";

  // Part of a chunk (rows 1000..1099 of w), and a box of another dtype: through a tensor.
  dcp::State parts;
  parts.put("w", dcp::Shard{at::zeros({100, 1024}), {1000, 0}, {kBytes / 4 / 1024, 1024}});
  parts.put("b", at::zeros({7}, at::kDouble));
  dcp::load(parts, ck);
  EXPECT_EQ(parts.tensor("w")[0][3].item<double>(), 1000.0 * 1024 + 3);
  EXPECT_EQ(parts.tensor("b")[6].item<double>(), 2.5);
}

// Issue 46, Note [What a load costs]: the objects of one checkpoint share one pickle
// allowance. Each object here, a list of 300,000 empty lists, costs about 58 MB to hold
// from a few hundred KB of pickle: one fits its own 64 bytes per byte plus the allowance,
// and loads; with four, each took the whole allowance again.
TEST(Dcp, TheObjectsOfOneCheckpointShareOnePickleAllowance) {
  const testing::TempDir dir("dcp");
  c10::impl::GenericList many(c10::AnyType::get());
  for (int j = 0; j < 300000; ++j) many.push_back(c10::impl::GenericList(c10::AnyType::get()));
  const std::string one = dir.path() + "/one", four = dir.path() + "/four";
  {
    dcp::State state;
    state.put("objects.0", c10::IValue(many));
    dcp::save(state, one);
    for (int i = 1; i < 4; ++i) state.put("objects." + std::to_string(i), c10::IValue(many));
    dcp::save(state, four);
  }
  EXPECT_EQ(dcp::load_all(one).at("objects.0").value.toListRef().size(), 300000u);
  EXPECT_THROW_MSG(dcp::load_all(four), CheckpointError, "MiB of memory to hold what it describes");
}

// Issue 46: a save never writes through a link at the checkpoint's name, nor into a
// directory another user owns (src/owned_directory.h); each refusal names the path and why.
TEST(Dcp, ASaveRefusesALinkAndAnotherUsersDirectory) {
  const testing::TempDir dir("dcp");
  const std::string victim = dir.path() + "/victim", link = dir.path() + "/linked";
  ASSERT_EQ(::mkdir(victim.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  dcp::State state;
  state.put("w", at::full({4, 4}, 2.0));
  EXPECT_THROW_MSG(dcp::save(state, link), CheckpointError, link + " is a symbolic link: refused");
  EXPECT_TRUE(datapar::detail::list_directory(victim).empty());
  if (::geteuid() != 0) GTEST_SKIP() << "the rest needs root, to give a directory to another user (chown)";
  const std::string theirs = dir.path() + "/theirs";
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  EXPECT_THROW_MSG(dcp::save(state, theirs), CheckpointError, theirs + " is owned by uid 65534, not by this user");
  EXPECT_TRUE(datapar::detail::list_directory(theirs).empty());
}

// A rank that cannot write its file fails the save on every rank, without .metadata; the
// previous checkpoint still loads. Then damaged data files: each a clear error.
TEST(Dcp, AFailedSaveLeavesNoCheckpointAndDamageIsNamed) {
  const testing::TempDir dir("dcp");
  const std::string good = dir.path() + "/step-1";
  const std::string bad = dir.path() + "/step-2";
  ASSERT_EQ(::mkdir(bad.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((bad + "/__1_0.distcp").c_str(), 0755), 0);  // rank 1's file cannot replace a directory
  testing::run_gloo_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
    dcp::State state;
    state.put("w", at::full({4, 4}, 2.0));
    dcp::save(state, good, *group);
    EXPECT_THROW_MSG(dcp::save(state, bad, *group), CheckpointError, "rank 1: ");
  });
  EXPECT_FALSE(dcp::is_checkpoint(bad));
  EXPECT_TRUE(dcp::is_checkpoint(good));
  // What loading `ck` on one rank says: "" when it loads.
  auto load_w = [](const std::string& ck) {
    std::string error;
    testing::run_gloo_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
      dcp::State state;
      state.put("w", at::zeros({4, 4}));
      try {
        dcp::load(state, ck, *group);
        EXPECT_TRUE(at::equal(state.tensor("w"), at::full({4, 4}, 2.0)));
      } catch (const CheckpointError& e) {
        error = e.what();
      }
    });
    return error;
  };
  EXPECT_THAT_ERROR(load_w(bad), "no .metadata file: not a checkpoint, or an incomplete one");
  EXPECT_EQ(load_w(good), "");

  // Metadata that claims a tensor far larger than its bytes: refused before anything is allocated.
  {
    const std::string saved = read_file(good + "/.metadata");
    Metadata md = parse(saved);
    md.entries[0].size = {int64_t{1} << 20, int64_t{1} << 20};
    md.entries[0].chunks = {{{0, 0}, {int64_t{1} << 20, int64_t{1} << 20}}};
    md.entries[0].storage.resize(1);
    write_file(good + "/.metadata", dcp::detail::write_metadata(md, good));
    EXPECT_THROW_MSG(dcp::load_all(good), CheckpointError, "w claims 1099511627776 elements of Float but its chunks");
    write_file(good + "/.metadata", saved);
  }
  // Issue 46: entries whose byte ranges overlap (100 of them on one 20 MB item took 2.3 GiB
  // to load) are refused: each item is stored once.
  {
    const std::string saved = read_file(good + "/.metadata");
    Metadata md = parse(saved);
    ASSERT_EQ(md.entries.size(), 1u);
    md.entries.push_back(md.entries[0]);
    md.entries[1].fqn = "w2";
    write_file(good + "/.metadata", dcp::detail::write_metadata(md, good));
    EXPECT_THROW_MSG(dcp::load_all(good), CheckpointError, "overlap those of w");
    write_file(good + "/.metadata", saved);
  }

  // The one data file that holds w (rank 0 or 1 wrote it): truncated, flipped, missing.
  std::string file = good + "/__0_0.distcp";
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0 || st.st_size == 0) file = good + "/__1_0.distcp";
  const std::string bytes = read_file(file);
  write_file(file, bytes.substr(0, bytes.size() / 2));
  EXPECT_THAT_ERROR(load_w(good), "(a truncated copy?)");
  std::string flipped = bytes;
  flipped[flipped.size() - 200] ^= 0x10;  // in the zip directory's last entries
  write_file(file, flipped);
  EXPECT_NE(load_w(good), "");
  std::string tensor_bit = bytes;
  // A bit of w's 64 bytes, before the next record (and any 16-byte data descriptor).
  tensor_bit[bytes.find("PK\x03\x04", bytes.find("data/0")) - 20] ^= 0x01;
  write_file(file, tensor_bit);
  EXPECT_THAT_ERROR(load_w(good), "its CRC-32 does not match");
  ::unlink(file.c_str());
  EXPECT_THAT_ERROR(load_w(good), "is missing (No such file or directory): the checkpoint was not copied whole");

  // Issue 46: a FIFO planted under a file's name is refused before open() blocks (it
  // blocked --resume for ever).
  ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0);
  EXPECT_THAT_ERROR(load_w(good), "is not a regular file (a FIFO, device, socket or directory?)");
  ::unlink(file.c_str());
  const std::string metadata = good + "/.metadata";
  ::unlink(metadata.c_str());
  ASSERT_EQ(::mkfifo(metadata.c_str(), 0644), 0);
  EXPECT_THAT_ERROR(load_w(good), ".metadata is not a regular file");
}

// Issue 46: the data files are opened one at a time, so a checkpoint of more ranks' files
// than the process may open loads (1100 files under ulimit -n 1024 failed: "Too many open
// files"). Four ranks' files here, under a limit that leaves two descriptors free.
TEST(Dcp, ACheckpointOfManyFilesLoadsUnderALimitOfOpenFiles) {
  const testing::TempDir dir("dcp");
  const std::string ck = dir.path() + "/step-1";
  testing::run_gloo_ranks(4, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    dcp::State state;
    state.put("w", dcp::Shard{at::arange(16, at::kFloat).view({4, 4}).narrow(0, rank, 1).clone(), {rank, 0}, {4, 4}});
    dcp::save(state, ck, *group);
  });
  int files = 0;
  for (int r = 0; r < 4; ++r) {
    struct stat st {};
    if (::stat((ck + "/__" + std::to_string(r) + "_0.distcp").c_str(), &st) == 0 && st.st_size > 0) ++files;
  }
  ASSERT_EQ(files, 4);
  // The limit: just above the second free descriptor number, so that two files at most can
  // be open at once.
  int free_seen = 0, limit = 0;
  for (int fd = 0; free_seen < 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1) ++free_seen;
    limit = fd + 1;
  }
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(limit);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::string error;
  dcp::State loaded;
  try {
    loaded = dcp::load_all(ck);
  } catch (const std::exception& e) {
    error = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_EQ(error, "");
  EXPECT_TRUE(at::equal(loaded.tensor("w"), at::arange(16, at::kFloat).view({4, 4})));
}

}  // namespace
}  // namespace datapar
