// Checkpoints written in the background (issue 49): the file holds the state at the save,
// not what training did next; a failed write is reported, once, at the next check, save or
// wait, or by the destructor; a save while one is in flight waits for it and warns. (A kill
// during the background write: checkpoint_test.cc, which forks.)
#include "datapar/train/async_checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "datapar/dcp/async_save.h"
#include "datapar/error.h"
#include "datapar/models/mlp.h"
#include "file_system.h"
#include "testing/captured_warnings.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"
#include "testing/temp_dir.h"

namespace datapar::train {
namespace {

using models::Mlp;

// A few Adam steps on random data: parameters and both moments move at every step.
void adam_steps(Mlp& model, torch::optim::Adam& adam, int steps) {
  for (int i = 0; i < steps; ++i) {
    adam.zero_grad();
    const int64_t inputs = model->parameters().front().size(1);
    model->forward(at::randn({16, inputs})).pow(2).mean().backward();
    adam.step();
  }
}

// Every tensor of the checkpoint, deep-copied: what the file must hold.
Checkpoint copy_of(const Checkpoint& c) {
  Checkpoint out = c;
  out.model = StateDict();
  for (const auto& item : c.model) out.model.insert(item.key(), item.value().clone());
  out.optimizer = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  const auto state = c.optimizer.at("state").toGenericDict();
  c10::impl::GenericDict state_copy(state.keyType(), state.valueType());
  for (const auto& entry : state) {
    c10::impl::GenericDict per(c10::StringType::get(), c10::AnyType::get());
    for (const auto& kv : entry.value().toGenericDict()) per.insert(kv.key(), kv.value().toTensor().clone());
    state_copy.insert(entry.key(), per);
  }
  out.optimizer.insert("state", state_copy);
  return out;
}

void expect_holds(const std::string& path, const Checkpoint& want) {
  const Checkpoint got = load_checkpoint(path);
  EXPECT_EQ(got.epoch, want.epoch);
  for (const auto& item : want.model) EXPECT_TRUE(at::equal(got.model[item.key()], item.value())) << item.key();
  const auto want_state = want.optimizer.at("state").toGenericDict();
  const auto got_state = got.optimizer.at("state").toGenericDict();
  ASSERT_EQ(got_state.size(), want_state.size());
  for (const auto& entry : want_state) {
    for (const auto& kv : entry.value().toGenericDict()) {
      EXPECT_TRUE(at::equal(got_state.at(entry.key()).toGenericDict().at(kv.key()).toTensor(), kv.value().toTensor()))
          << "parameter " << entry.key().toInt() << ", " << kv.key().toStringRef();
    }
  }
}

TEST(AsyncCheckpoint, TheFileHoldsTheStateAtTheSaveNotWhatTrainingDidNext) {
  const testing::TempDir temp("async_state");
  Mlp model(std::vector<int64_t>{8, 256, 256, 4});
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
  adam_steps(model, adam, 3);
  AsyncCheckpointWriter writer;
  for (int64_t epoch = 1; epoch <= 3; ++epoch) {  // the staging buffers reused from the second on
    const Checkpoint now = make_checkpoint(*model, adam, epoch);
    const Checkpoint want = copy_of(now);
    writer.save(now, checkpoint_path(temp.path(), epoch), 0);
    adam_steps(model, adam, 2);  // in place, while the write may still be going on
    writer.wait();
    expect_holds(checkpoint_path(temp.path(), epoch), want);
  }
  EXPECT_FALSE(writer.in_flight());
}

TEST(AsyncCheckpoint, OnlyRankZeroWrites) {
  const testing::TempDir temp("async_rank");
  Mlp model(std::vector<int64_t>{8, 4});
  torch::optim::Adam adam(model->parameters());
  AsyncCheckpointWriter writer;
  writer.save(make_checkpoint(*model, adam, 1), checkpoint_path(temp.path(), 1), 1);
  writer.wait();
  EXPECT_FALSE(detail::exists(checkpoint_path(temp.path(), 1)));
}

TEST(AsyncCheckpoint, AFailedWriteIsReportedOnceAtTheNextSaveOrWait) {
  const testing::TempDir temp("async_fail");
  std::ofstream(temp.path() + "/a-file") << "not a directory";
  const std::string bad = temp.path() + "/a-file/checkpoint-epoch-1.pt";  // ENOTDIR when written
  Mlp model(std::vector<int64_t>{8, 4});
  torch::optim::Adam adam(model->parameters());
  AsyncCheckpointWriter writer;
  writer.save(make_checkpoint(*model, adam, 1), bad, 0);  // returns: the write fails later
  // The next save reports it before staging anything, and is not made.
  const std::string good = checkpoint_path(temp.path(), 2);
  EXPECT_THROW_MSG(writer.save(make_checkpoint(*model, adam, 2), good, 0), CheckpointError,
                            "the checkpoint " + bad + " was not written");
  EXPECT_FALSE(detail::exists(good));
  writer.save(make_checkpoint(*model, adam, 2), good, 0);  // reported once: this one goes
  writer.wait();
  EXPECT_EQ(load_checkpoint(good).epoch, 2);
  // A failure found by wait() (at the end of a run).
  writer.save(make_checkpoint(*model, adam, 3), bad, 0);
  EXPECT_THROW_MSG(writer.wait(), CheckpointError, "The checkpoint before it is unchanged");
  writer.wait();
  writer.check();
}

TEST(AsyncCheckpoint, AFailureNobodyAskedForIsWarnedAboutWhenTheWriterGoes) {
  const testing::TempDir temp("async_unreported");
  std::ofstream(temp.path() + "/a-file") << "not a directory";
  const std::string bad = temp.path() + "/a-file/checkpoint-epoch-1.pt";
  Mlp model(std::vector<int64_t>{8, 4});
  torch::optim::Adam adam(model->parameters());
  testing::CapturedWarnings warnings;
  {
    AsyncCheckpointWriter writer;
    writer.save(make_checkpoint(*model, adam, 1), bad, 0);
  }
  const auto messages = warnings.messages();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_NE(messages[0].find("the checkpoint " + bad + " was not written, and nothing reported it"), std::string::npos)
      << messages[0];
}

// Two ranks of one group: rank 1 writes a 64 MiB tensor (the save gives each whole tensor to
// the rank with the fewest bytes so far: rank 1 holds the smaller shard), so rank 0's first
// save is still in flight (waiting for rank 1's byte ranges) when rank 0 saves again: the
// second save waits for it, warns, and then stages. Each directory holds the values of its
// own save.
TEST(AsyncDcp, ASaveWhileOneIsInFlightWaitsForItWithAWarningAndEachHoldsItsOwnState) {
  const testing::TempDir temp("async_dcp");
  testing::CapturedWarnings warnings;
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    dcp::AsyncSaver saver(group);
    at::Tensor weights = at::arange(1000, at::kFloat).reshape({10, 100});
    const at::Tensor big = at::ones({int64_t{16} << 20});
    dcp::State state;
    state.put("w", rank == 0 ? dcp::Shard{weights.narrow(0, 0, 9), {0, 0}, {10, 100}}
                             : dcp::Shard{weights.narrow(0, 9, 1), {9, 0}, {10, 100}});
    state.put("big", big);
    state.put("step", c10::IValue(int64_t(1)));
    saver.save(state, temp.path() + "/one");
    weights.mul_(-1);  // the next step, in place
    state.entries()[2].value = int64_t(2);
    saver.save(state, temp.path() + "/two");
    saver.wait();
  });
  bool named = false;
  for (const std::string& m : warnings.messages()) {
    named = named || m.find("the checkpoint " + temp.path() + "/two waits for the write of " + temp.path() + "/one") !=
                         std::string::npos;
  }
  EXPECT_TRUE(named) << "no warning named the save that waited";
  const dcp::State one = dcp::load_all(temp.path() + "/one"), two = dcp::load_all(temp.path() + "/two");
  EXPECT_TRUE(at::equal(one.tensor("w"), at::arange(1000, at::kFloat).reshape({10, 100})));
  EXPECT_TRUE(at::equal(two.tensor("w"), -at::arange(1000, at::kFloat).reshape({10, 100})));
  EXPECT_EQ(one.at("step").value.toInt(), 1);
  EXPECT_EQ(two.at("step").value.toInt(), 2);
}

// Each rank stages only what it writes: its shards and the whole tensors the save gives it
// (the one with the fewest bytes so far), not every replicated tensor: two ranks, four
// replicated 1 MiB tensors, each rank stages two.
TEST(AsyncDcp, EachRankStagesOnlyWhatItWrites) {
  const testing::TempDir temp("async_dcp_share");
  std::vector<int64_t> staged(2, 0);
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    dcp::AsyncSaver saver(group);
    dcp::State state;
    for (int i = 0; i < 4; ++i) state.put("t" + std::to_string(i), at::full({int64_t{1} << 18}, i, at::kFloat));
    saver.save(state, temp.path() + "/ck");
    saver.wait();
    staged[rank] = saver.staging_bytes();
  });
  EXPECT_EQ(staged[0], int64_t{2} << 20);
  EXPECT_EQ(staged[1], int64_t{2} << 20);
  const dcp::State back = dcp::load_all(temp.path() + "/ck");
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(at::equal(back.tensor("t" + std::to_string(i)), at::full({int64_t{1} << 18}, i, at::kFloat)));
}

// A saver's next save of the same layout reuses the agreed plan (Note [A plan remembered]):
// the values are new each time; a rank whose layout changed alone still makes every rank
// fail with the difference named, even the rank whose layout is the one it had; a layout
// that changed on every rank is agreed again; a directory one rank cannot use still fails
// every rank.
TEST(AsyncDcp, ASaveOfTheLayoutBeforeReusesItsPlanAndAChangedOneIsAgreedAgain) {
  const testing::TempDir temp("async_dcp_memo");
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    dcp::AsyncSaver saver(group);
    const at::Tensor weights = at::arange(1000, at::kFloat).reshape({10, 100});
    dcp::State state;
    state.put("w", rank == 0 ? dcp::Shard{weights.narrow(0, 0, 4), {0, 0}, {10, 100}}
                             : dcp::Shard{weights.narrow(0, 4, 6), {4, 0}, {10, 100}});
    state.put("bias", at::zeros({7}));
    state.put("step", c10::IValue(int64_t(0)));
    for (int64_t step = 1; step <= 3; ++step) {  // the first save agrees the plan, the others reuse it
      weights.add_(1);
      state.entries()[1].boxes[0].local.fill_(static_cast<float>(step));
      state.entries()[2].value = step;
      saver.save(state, temp.path() + "/step" + std::to_string(step));
    }
    saver.wait();
    // Rank 1 alone has another entry: both ranks fail, naming it.
    dcp::State other = state;
    if (rank == 1) other.put("extra", at::ones({3}));
    EXPECT_THROW_MSG(saver.save(other, temp.path() + "/differ"), InvalidArgumentError, "the ranks' states differ");
    // Both have it now: a plan of the new layout, then reused.
    state.put("extra", at::full({3}, static_cast<float>(rank)));
    saver.save(state, temp.path() + "/extra1");
    saver.save(state, temp.path() + "/extra2");
    saver.wait();
    // A directory that holds a checkpoint already: every rank fails, the plan kept.
    EXPECT_THROW_MSG(saver.save(state, temp.path() + "/extra2"), CheckpointError, "holds a checkpoint already");
    saver.save(state, temp.path() + "/extra3");
    saver.wait();
  });
  for (int64_t step = 1; step <= 3; ++step) {
    const dcp::State back = dcp::load_all(temp.path() + "/step" + std::to_string(step));
    EXPECT_TRUE(at::equal(back.tensor("w"), at::arange(1000, at::kFloat).reshape({10, 100}) + step)) << step;
    EXPECT_TRUE(at::equal(back.tensor("bias"), at::full({7}, static_cast<float>(step)))) << step;
    EXPECT_EQ(back.at("step").value.toInt(), step);
  }
  for (const char* name : {"/extra1", "/extra2", "/extra3"}) {
    const dcp::State back = dcp::load_all(temp.path() + name);
    EXPECT_EQ(back.tensor("extra").size(0), 3) << name;
    EXPECT_TRUE(at::equal(back.tensor("w"), at::arange(1000, at::kFloat).reshape({10, 100}) + 3)) << name;
  }
  EXPECT_FALSE(datapar::detail::exists(temp.path() + "/differ/.metadata"));
}

}  // namespace
}  // namespace datapar::train
