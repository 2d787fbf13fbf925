// Checkpoints: resuming reproduces an uninterrupted run bit for bit; only rank 0 writes;
// a crash mid-write keeps the previous checkpoint; damaged files are refused by name.
#include "datapar/train/checkpoint.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "child_process.h"
#include "datapar/error.h"
#include "datapar/train/async_checkpoint.h"
#include "datapar/models/mlp.h"
#include "serialization/torch_file.h"
#include "testing/expect_throw.h"
#include "testing/temp_dir.h"
#include "file_system.h"

namespace datapar::train {
namespace {

using models::Mlp;

Mlp mlp(std::vector<int64_t> sizes) { return Mlp(std::move(sizes)); }

struct Data {
  at::Tensor x;  // (64, 8)
  at::Tensor y;  // (64,) classes 0..2
};

Data make_data() { return {at::randn({64, 8}), at::randint(0, 3, {64}, at::kLong)}; }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Mlp& model, bool adam) {
  if (adam) return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
  return std::make_unique<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-4));
}

// One epoch of minibatches in an order, with input noise and dropout, that all come from
// the default generator: a resumed run only matches if the RNG state was restored.
void train_epoch(Mlp& model, torch::optim::Optimizer& optimizer, const Data& data) {
  const at::Tensor order = at::randperm(64);
  for (int64_t b = 0; b < 64; b += 16) {
    const at::Tensor idx = order.slice(0, b, b + 16);
    at::Tensor x = data.x.index_select(0, idx);
    x = at::dropout(x + 0.1 * at::randn_like(x), 0.2, /*train=*/true);
    optimizer.zero_grad();
    at::nll_loss(at::log_softmax(model->forward(x), 1), data.y.index_select(0, idx)).backward();
    optimizer.step();
  }
}

void expect_same_parameters(Mlp& a, Mlp& b) {
  const auto pa = a->named_parameters();
  const auto pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
}

class CheckpointResume : public ::testing::TestWithParam<bool> {};

TEST_P(CheckpointResume, GivesTheSameParametersAsAnUninterruptedRun) {
  const bool adam = GetParam();
  const testing::TempDir temp(adam ? "resume_adam" : "resume_sgd");
  const std::string& dir = temp.path();

  torch::manual_seed(42);
  const Data data = make_data();
  const RngState rng_after_data = get_rng_state();
  Mlp straight = mlp({8, 16, 16, 3});
  auto straight_opt = make_optimizer(straight, adam);
  for (int epoch = 0; epoch < 4; ++epoch) train_epoch(straight, *straight_opt, data);

  set_rng_state(rng_after_data);
  {
    Mlp first = mlp({8, 16, 16, 3});
    auto opt = make_optimizer(first, adam);
    for (int epoch = 0; epoch < 2; ++epoch) train_epoch(first, *opt, data);
    EXPECT_TRUE(save_checkpoint(make_checkpoint(*first, *opt, 2, {{"seed", 42}, {"consumed_samples", 128}}),
                                checkpoint_path(dir, 2), /*rank=*/0));
  }
  // Fresh objects, another initialization, a disturbed generator: the checkpoint must
  // bring all of it back.
  torch::manual_seed(7);
  Mlp resumed = mlp({8, 16, 16, 3});
  auto opt = make_optimizer(resumed, adam);
  const auto last = latest_checkpoint(dir);
  ASSERT_TRUE(last.has_value());
  const Checkpoint c = load_checkpoint(*last);
  EXPECT_EQ(c.epoch, 2);
  EXPECT_EQ(c.progress, (Progress{{"seed", 42}, {"consumed_samples", 128}}));
  restore_checkpoint(c, *resumed, *opt);
  const RngState rng_at_resume = get_rng_state();
  for (int64_t epoch = c.epoch; epoch < 4; ++epoch) train_epoch(resumed, *opt, data);
  expect_same_parameters(straight, resumed);

  // The test can tell: without the RNG state, the same resume ends elsewhere.
  torch::manual_seed(7);
  Mlp no_rng = mlp({8, 16, 16, 3});
  auto no_rng_opt = make_optimizer(no_rng, adam);
  restore_checkpoint(c, *no_rng, *no_rng_opt, /*restore_rng=*/false);
  ASSERT_FALSE(at::equal(get_rng_state().cpu, rng_at_resume.cpu));
  for (int64_t epoch = c.epoch; epoch < 4; ++epoch) train_epoch(no_rng, *no_rng_opt, data);
  EXPECT_FALSE(at::equal(no_rng->named_parameters()["layers.0.weight"], straight->named_parameters()["layers.0.weight"]));
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, CheckpointResume, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Adam" : "SgdNesterov"; });

TEST(Checkpoint, OnlyRankZeroWritesAndLoadsOntoTheGivenDevice) {
  const testing::TempDir temp("ranks");
  const std::string& dir = temp.path();
  Mlp model = mlp({4, 5, 2});
  auto opt = make_optimizer(model, false);
  const Checkpoint c = make_checkpoint(*model, *opt, 1);
  for (int64_t rank = 1; rank < 4; ++rank) EXPECT_FALSE(save_checkpoint(c, checkpoint_path(dir, 1), rank));
  EXPECT_FALSE(latest_checkpoint(dir).has_value());
  EXPECT_TRUE(save_checkpoint(c, checkpoint_path(dir, 1), 0));
  const Checkpoint back = load_checkpoint(checkpoint_path(dir, 1), c10::Device("cpu"));
  for (const auto& item : back.model) EXPECT_TRUE(item.value().device().is_cpu());
  EXPECT_EQ(back.path, checkpoint_path(dir, 1));
  EXPECT_EQ(checkpoint_path(dir + "/", 12), dir + "/checkpoint-epoch-12.pt");
}

// Issue 27: ranks compare what they resume by Checkpoint::digest, made while loading
// (no second read): a copy of a file has the file's digest, a checkpoint with other values
// another one, and load_latest_checkpoint gives the same digest as load_checkpoint.
TEST(Checkpoint, EqualFilesLoadWithEqualDigests) {
  const testing::TempDir temp("digest");
  const std::string& dir = temp.path();
  Mlp model = mlp({4, 5, 2});
  auto opt = make_optimizer(model, false);
  save_checkpoint(make_checkpoint(*model, *opt, 1), checkpoint_path(dir, 1), 0);
  {
    torch::NoGradGuard no_grad;
    model->parameters()[0].add_(1.0);
  }
  save_checkpoint(make_checkpoint(*model, *opt, 1), dir + "/other.pt", 0);
  detail::make_directories(dir + "/copy");
  {
    std::ifstream from(checkpoint_path(dir, 1), std::ios::binary);
    std::ofstream(checkpoint_path(dir + "/copy", 1), std::ios::binary) << from.rdbuf();
  }
  const uint32_t digest = load_checkpoint(checkpoint_path(dir, 1)).digest;
  EXPECT_NE(digest, 0u);
  EXPECT_EQ(load_checkpoint(checkpoint_path(dir + "/copy", 1)).digest, digest);
  EXPECT_NE(load_checkpoint(dir + "/other.pt").digest, digest);
  const LatestCheckpoint latest = load_latest_checkpoint(dir + "/copy", 0, c10::Device("cpu"));
  ASSERT_TRUE(latest.checkpoint.has_value());
  EXPECT_EQ(latest.checkpoint->digest, digest);
}

TEST(Checkpoint, LatestSkipsDamagedCheckpointsAndTemporaries) {
  const testing::TempDir temp("latest");
  const std::string& dir = temp.path();
  EXPECT_FALSE(latest_checkpoint(dir + "/missing").has_value());
  Mlp model = mlp({4, 5, 2});
  auto opt = make_optimizer(model, false);
  for (int64_t epoch : {1, 2, 10}) save_checkpoint(make_checkpoint(*model, *opt, epoch), checkpoint_path(dir, epoch), 0);
  EXPECT_EQ(latest_checkpoint(dir), checkpoint_path(dir, 10));  // numeric, not alphabetical
  std::ofstream(checkpoint_path(dir, 11) + ".tmp.123") << "interrupted";
  std::ofstream(dir + "/checkpoint-epoch-x.pt") << "not ours";
  ::truncate(checkpoint_path(dir, 10).c_str(), 100);  // damaged newest
  EXPECT_EQ(latest_checkpoint(dir), checkpoint_path(dir, 2));
}

// A real SIGKILL at a random moment of a large write, many times over: the file at the
// path always loads, and holds the old checkpoint or the new one, whole.
TEST(Checkpoint, KillDuringSaveLeavesALoadableCheckpoint) {
  const testing::TempDir temp("kill");
  const std::string& dir = temp.path();
  const std::string path = checkpoint_path(dir, 1);
  Mlp model = mlp({1024, 2048, 1024, 10});  // about 4.2 M parameters, 17 MB
  auto opt = make_optimizer(model, false);
  save_checkpoint(make_checkpoint(*model, *opt, 1), path, 0);
  const Checkpoint next = make_checkpoint(*model, *opt, 2);
  int killed_mid_write = 0;
  for (int round = 0; round < 4; ++round) {
    const pid_t pid = datapar::detail::fork_child(
        [&] {
          while (true) save_checkpoint(next, path, 0);  // overwrites until killed
          return 0;
        },
        "writer");
    ASSERT_GT(pid, 0);
    // The writer's temporary: ".checkpoint-epoch-1.pt.tmp.<host>.<pid>-<random>" (Note
    // [Creating a file] in src/new_file.cc), a new name for each save.
    const std::string mine = "." + std::to_string(pid) + "-";
    auto writers_temporary = [&] {
      for (const std::string& name : datapar::detail::list_directory(dir)) {
        if (name.rfind(".checkpoint-epoch-1.pt.tmp.", 0) == 0 && name.find(mine) != std::string::npos) {
          return dir + "/" + name;
        }
      }
      return std::string();
    };
    std::string temp;
    struct stat st {};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (((temp = writers_temporary()).empty() || ::stat(temp.c_str(), &st) != 0 || st.st_size == 0) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 3));
    ::kill(pid, SIGKILL);
    ASSERT_EQ(datapar::detail::wait_child(pid).signal, SIGKILL);
    temp = writers_temporary();  // the save in progress when the kill came, if any
    if (!temp.empty()) ++killed_mid_write;
    const Checkpoint c = load_checkpoint(path);
    EXPECT_TRUE(c.epoch == 1 || c.epoch == 2);
    EXPECT_TRUE(at::equal(c.model["layers.0.weight"], next.model["layers.0.weight"]));
    EXPECT_EQ(latest_checkpoint(dir), path);
    if (!temp.empty()) ::unlink(temp.c_str());
  }
  EXPECT_GT(killed_mid_write, 0) << "no kill landed inside a write; the test proved nothing";
}

// A few Adam steps on random data.
void adam_steps(Mlp& model, torch::optim::Adam& adam, int steps) {
  for (int i = 0; i < steps; ++i) {
    adam.zero_grad();
    model->forward(at::randn({16, model->parameters().front().size(1)})).pow(2).mean().backward();
    adam.step();
  }
}

// A real SIGKILL while the writer's thread writes a large checkpoint (the training thread
// goes on meanwhile): the previous checkpoint is the latest that loads, and the partial
// one is never taken.
TEST(Checkpoint, AKillDuringABackgroundWriteLeavesThePreviousCheckpoint) {
  const testing::TempDir temp("async_kill");
  const std::string& dir = temp.path();
  int killed_mid_write = 0;
  for (int round = 0; round < 3; ++round) {
    const std::string before = checkpoint_path(dir, 2 * round + 1), after = checkpoint_path(dir, 2 * round + 2);
    const pid_t pid = detail::fork_child(
        [&] {
          at::set_num_threads(1);  // no OpenMP pool in a forked child
          Mlp model(std::vector<int64_t>{1024, 4096, 4096, 10});  // 21 M parameters: 84 MB, 250 MB with Adam's moments
          torch::optim::Adam adam(model->parameters());
          save_checkpoint(make_checkpoint(*model, adam, 2 * round + 1), before, 0);
          adam_steps(model, adam, 1);
          AsyncCheckpointWriter writer;
          writer.save(make_checkpoint(*model, adam, 2 * round + 2), after, 0);
          for (;;) adam_steps(model, adam, 1);  // training goes on until killed
          return 0;
        },
        "async writer");
    ASSERT_GT(pid, 0);
    const std::string prefix = "." + after.substr(dir.size() + 1) + ".tmp.";
    auto temporary = [&] {
      for (const std::string& name : detail::list_directory(dir)) {
        if (name.rfind(prefix, 0) == 0) return dir + "/" + name;
      }
      return std::string();
    };
    std::string partial;
    struct stat st {};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (((partial = temporary()).empty() || ::stat(partial.c_str(), &st) != 0 || st.st_size == 0) &&
           !detail::exists(after) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 5));
    ::kill(pid, SIGKILL);
    ASSERT_EQ(detail::wait_child(pid).signal, SIGKILL);
    const bool mid_write = !detail::exists(after) && !temporary().empty();
    killed_mid_write += mid_write ? 1 : 0;
    const LatestCheckpoint last = load_latest_checkpoint(dir, 0);
    ASSERT_TRUE(last.checkpoint.has_value());
    EXPECT_EQ(last.checkpoint->epoch, mid_write ? 2 * round + 1 : 2 * round + 2);
    EXPECT_TRUE(last.damaged.empty()) << last.damaged.front().problem;
  }
  EXPECT_GT(killed_mid_write, 0) << "no kill landed inside a background write; the test proved nothing";
}

// ---- damaged and foreign files: a CheckpointError naming the file and the problem ----

class CheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = checkpoint_path(dir_, 3);
    opt_ = make_optimizer(model_, false);
    train_epoch(model_, *opt_, make_data());  // momentum buffers exist
    save_checkpoint(make_checkpoint(*model_, *opt_, 3), path_, 0);
  }
  // Writes `root` as a file and returns its path.
  std::string write(const c10::IValue& root) {
    const std::string p = dir_ + "/crafted.pt";
    detail::torch_save(root, p);
    return p;
  }
  c10::impl::GenericDict root() { return detail::torch_load(path_).toGenericDict(); }

  const testing::TempDir temp_{"errors"};
  const std::string& dir_ = temp_.path();
  std::string path_;
  Mlp model_ = mlp({8, 6, 3});
  std::unique_ptr<torch::optim::Optimizer> opt_;
};

TEST_F(CheckpointErrors, RandomBytesAndTruncation) {
  std::ifstream in(path_, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string noise(bytes.size(), '\0');
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << noise;
  EXPECT_THROW_MSG(load_checkpoint(path_), CheckpointError, path_ + ": cannot read");
  for (size_t keep : {size_t{0}, size_t{30}, bytes.size() / 3, bytes.size() - 1}) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes.substr(0, keep);
    EXPECT_THROW_MSG(load_checkpoint(path_), CheckpointError, path_ + ": cannot read");
  }
  EXPECT_THROW_MSG(load_checkpoint(dir_ + "/nope.pt"), CheckpointError, "nope.pt: cannot open");
}

TEST_F(CheckpointErrors, WrongFormat) {
  StateDict bare = state_dict(*model_);
  save_state_dict(bare, dir_ + "/bare.pt");
  EXPECT_THROW_MSG(load_checkpoint(dir_ + "/bare.pt"), CheckpointError, "bare.pt: is a state dict, not a checkpoint");
  EXPECT_THROW_MSG(load_state_dict_file(path_), CheckpointError, "is a checkpoint, not a state dict");
  auto r = root();
  r.insert_or_assign("format", "datapar.checkpoint/2");
  EXPECT_THROW_MSG(load_checkpoint(write(r)), CheckpointError, "crafted.pt: has format \"datapar.checkpoint/2\"");
  r.insert_or_assign("format", "something else");
  EXPECT_THROW_MSG(load_checkpoint(write(r)), CheckpointError, "not a datapar checkpoint");
  EXPECT_THROW_MSG(load_checkpoint(write(c10::IValue(int64_t{3}))), CheckpointError, "holds a int, not a checkpoint dict");
}

TEST_F(CheckpointErrors, MissingKeysAndWrongTypes) {
  for (const char* key : {"model", "optimizer", "epoch", "progress", "rng"}) {
    auto r = root();
    static_cast<void>(r.erase(key));
    EXPECT_THROW_MSG(load_checkpoint(write(r)), CheckpointError, std::string("crafted.pt: has no \"") + key + "\" entry");
  }
  auto r = root();
  r.insert_or_assign("epoch", "three");
  EXPECT_THROW_MSG(load_checkpoint(write(r)), CheckpointError, "\"epoch\" is a str, expected an int");
  r = root();
  r.at("model").toGenericDict().insert_or_assign("layers.0.weight", 1.5);
  EXPECT_THROW_MSG(load_checkpoint(write(r)), CheckpointError, "\"model\" entry layers.0.weight is a float, expected a tensor");
  r = root();
  r.at("rng").toGenericDict().insert_or_assign("cpu", at::zeros({4}));
  EXPECT_THROW_MSG(load_checkpoint(write(r)), CheckpointError, "\"rng\" entry cpu is a Tensor, expected a uint8 tensor");
}

TEST_F(CheckpointErrors, WrongShapesChangeNothing) {
  const at::Tensor before = model_->named_parameters()["layers.0.weight"].clone();
  Checkpoint c = load_checkpoint(path_);
  c.model["layers.0.weight"] = at::zeros({6, 5});
  save_checkpoint(c, dir_ + "/shape.pt", 0);
  Checkpoint bad = load_checkpoint(dir_ + "/shape.pt");
  EXPECT_THROW_MSG(restore_checkpoint(bad, *model_, *opt_), CheckpointError,
                   "shape.pt: model: layers.0.weight has shape [6, 5] in the checkpoint but [6, 8]");

  c = load_checkpoint(path_);
  c.optimizer.at("state").toGenericDict().at(int64_t{0}).toGenericDict().insert_or_assign("momentum_buffer", at::zeros({2}));
  c.model["layers.0.weight"] = at::zeros({6, 8});
  save_checkpoint(c, dir_ + "/buffer.pt", 0);
  bad = load_checkpoint(dir_ + "/buffer.pt");
  EXPECT_THROW_MSG(restore_checkpoint(bad, *model_, *opt_), CheckpointError,
                   "buffer.pt: optimizer state: the state of parameter 0 \"momentum_buffer\" has shape [2]");
  EXPECT_TRUE(at::equal(model_->named_parameters()["layers.0.weight"], before));  // unchanged

  Mlp other = mlp({8, 9, 3});
  auto other_opt = make_optimizer(other, false);
  EXPECT_THROW_MSG(restore_checkpoint(load_checkpoint(path_), *other, *other_opt), CheckpointError, "has shape [6, 8] in the checkpoint but [9, 8]");
}

// An int64 tensor used to load silently into a float parameter (copy_ converts).
TEST_F(CheckpointErrors, WrongDtypeChangesNothing) {
  const at::Tensor before = model_->named_parameters()["layers.0.weight"].clone();
  Checkpoint c = load_checkpoint(path_);
  c.model["layers.0.weight"] = c.model["layers.0.weight"].to(at::kLong);
  save_checkpoint(c, dir_ + "/dtype.pt", 0);
  EXPECT_THROW_MSG(restore_checkpoint(load_checkpoint(dir_ + "/dtype.pt"), *model_, *opt_), CheckpointError,
                   "dtype.pt: model: layers.0.weight is int64 in the checkpoint but float32 in datapar::models::MlpImpl");
  EXPECT_TRUE(at::equal(model_->named_parameters()["layers.0.weight"], before));
  c.path.clear();  // built in C++: named "checkpoint"
  EXPECT_THROW_MSG(restore_checkpoint(c, *model_, *opt_), CheckpointError, "checkpoint: model: layers.0.weight is int64");
}

// A Checkpoint built in C++ can hold a dict inside itself, which no file can: walking it
// used to recurse until the stack ran out.
TEST_F(CheckpointErrors, OptimizerStateInsideItselfIsRefused) {
  Checkpoint c = load_checkpoint(path_);
  auto state = c.optimizer.at("state").toGenericDict();
  state.at(int64_t{0}).toGenericDict().insert("loop", state);  // state[0]["loop"] is state
  EXPECT_THROW_MSG(save_checkpoint(c, dir_ + "/loop.pt", 0), CheckpointError,
                   "loop.pt: optimizer state: a dict or list contains itself");
  EXPECT_THROW_MSG(restore_checkpoint(c, *model_, *opt_), CheckpointError,
                   "optimizer state: a dict or list contains itself");
  static_cast<void>(state.at(int64_t{0}).toGenericDict().erase("loop"));  // break the cycle: no leak

  // As deep as a file may be (200 levels): refused before anything is written.
  c = load_checkpoint(path_);
  c10::impl::GenericList deep(c10::AnyType::get());
  for (int i = 0; i < 250; ++i) {
    c10::impl::GenericList outer(c10::AnyType::get());
    outer.push_back(deep);
    deep = outer;
  }
  c.optimizer.insert("deep", deep);
  EXPECT_THROW_MSG(save_checkpoint(c, dir_ + "/deep.pt", 0), CheckpointError,
                   "deep.pt: optimizer state: nesting deeper than 200 levels");
  EXPECT_FALSE(std::ifstream(dir_ + "/deep.pt").good());
}

// Note [Damaged checkpoints]: the newest checkpoint that loads whole is used; each newer one
// is reported, and rank 0 renames it without replacing anything.
TEST(Checkpoint, LoadLatestMovesDamagedCheckpointsAsideAndFallsBack) {
  const testing::TempDir temp("load_latest");
  const std::string& dir = temp.path();
  EXPECT_FALSE(load_latest_checkpoint(dir + "/missing", 0).checkpoint.has_value());
  Mlp model = mlp({4, 5, 2});
  auto opt = make_optimizer(model, false);
  for (int64_t epoch : {1, 2, 3}) save_checkpoint(make_checkpoint(*model, *opt, epoch), checkpoint_path(dir, epoch), 0);
  const auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  // Epoch 3: one flipped bit in a tensor (the zip directory still reads: latest_checkpoint's
  // cheap check passes). Epoch 2: truncated.
  std::string three = read(checkpoint_path(dir, 3));
  three[caffe2::serialize::PyTorchStreamReader(checkpoint_path(dir, 3)).getRecordOffset("data/0") + 2] ^= 0x01;
  std::ofstream(checkpoint_path(dir, 3), std::ios::binary | std::ios::trunc) << three;
  ::truncate(checkpoint_path(dir, 2).c_str(), 100);
  const std::string two = read(checkpoint_path(dir, 2));
  EXPECT_EQ(latest_checkpoint(dir), checkpoint_path(dir, 3));

  // Another rank: same answer, nothing moved.
  LatestCheckpoint other = load_latest_checkpoint(dir, 1);
  ASSERT_TRUE(other.checkpoint.has_value());
  EXPECT_EQ(other.checkpoint->epoch, 1);
  ASSERT_EQ(other.damaged.size(), 2u);
  EXPECT_EQ(other.damaged[0].path, checkpoint_path(dir, 3));
  EXPECT_EQ(other.damaged[0].moved_to, "");
  EXPECT_EQ(other.set_aside, 0);
  EXPECT_EQ(read(checkpoint_path(dir, 3)), three);

  // Rank 0 moves both aside, naming why.
  LatestCheckpoint found = load_latest_checkpoint(dir, 0);
  ASSERT_TRUE(found.checkpoint.has_value());
  EXPECT_EQ(found.checkpoint->epoch, 1);
  EXPECT_EQ(found.checkpoint->path, checkpoint_path(dir, 1));
  ASSERT_EQ(found.damaged.size(), 2u);
  EXPECT_NE(found.damaged[0].problem.find(checkpoint_path(dir, 3) + ": "), std::string::npos) << found.damaged[0].problem;
  EXPECT_NE(found.damaged[1].problem.find(checkpoint_path(dir, 2) + ": cannot read"), std::string::npos);
  EXPECT_EQ(found.damaged[0].moved_to, checkpoint_path(dir, 3) + ".damaged");
  EXPECT_EQ(found.damaged[1].moved_to, checkpoint_path(dir, 2) + ".damaged");
  EXPECT_EQ(found.set_aside, 2);
  EXPECT_EQ(read(checkpoint_path(dir, 3) + ".damaged"), three);
  EXPECT_EQ(read(checkpoint_path(dir, 2) + ".damaged"), two);
  EXPECT_FALSE(std::ifstream(checkpoint_path(dir, 3)).good());
  EXPECT_EQ(latest_checkpoint(dir), checkpoint_path(dir, 1));  // *.damaged is not a checkpoint

  // Damaged again at the same epoch: the earlier evidence is kept.
  std::ofstream(checkpoint_path(dir, 3), std::ios::binary) << "not a zip";
  found = load_latest_checkpoint(dir, 0);
  ASSERT_EQ(found.damaged.size(), 1u);
  EXPECT_EQ(found.damaged[0].moved_to, checkpoint_path(dir, 3) + ".damaged.1");
  EXPECT_EQ(read(checkpoint_path(dir, 3) + ".damaged"), three);
  EXPECT_EQ(found.set_aside, 3);

  // Nothing intact: no checkpoint, but set_aside says the run had some.
  ::truncate(checkpoint_path(dir, 1).c_str(), 10);
  found = load_latest_checkpoint(dir, 0);
  EXPECT_FALSE(found.checkpoint.has_value());
  EXPECT_EQ(found.set_aside, 4);
}

// A file that loads but is not a checkpoint of this format is not damage: an error, left alone.
TEST(Checkpoint, LoadLatestLeavesForeignFilesAlone) {
  const testing::TempDir temp("load_latest_foreign");
  const std::string& dir = temp.path();
  save_state_dict(state_dict(*mlp({4, 5, 2})), checkpoint_path(dir, 1));
  EXPECT_THROW_MSG(load_latest_checkpoint(dir, 0), CheckpointError, "is a state dict, not a checkpoint");
  EXPECT_TRUE(std::ifstream(checkpoint_path(dir, 1)).good());
}

}  // namespace
}  // namespace datapar::train
