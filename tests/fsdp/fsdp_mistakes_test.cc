// FSDP as a user from PyTorch meets it (issue 51): a program whose model has named members
// (tests/testing/fsdp_mistake.cc), started by `datapar launch` as a user starts it. The
// natural way trains; each natural mistake ends the job with an exit status and a message
// that names FSDP and the fix, never a signal.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "testing/processes.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

testing::ProcessResult launch_mistake(const std::string& mistake) {
  const std::string bin = DATAPAR_BIN_DIR;
  const testing::TempDir logs("fsdp-mistake");
  bool timed_out = false;
  testing::ProcessResult r = testing::run_processes(
      {{bin + "/datapar", "launch", "--nproc-per-node", "2", "--", bin + "/fsdp_mistake", mistake}}, logs.path(), 120s,
      &timed_out)[0];
  EXPECT_FALSE(timed_out) << mistake << ": the job did not end in 120 s:\n" << r.output;
  return r;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(FsdpOnNamedMembers, FullyShardOnEachMemberTrainsAndCheckpointsThroughFsdp) {
  const testing::ProcessResult r = launch_mistake("named");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "rank 0: trained, checkpoint of 4 tensors")) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1: trained, checkpoint of 4 tensors")) << r.output;
}

// Each mistake: status 1 from the ranks (no signal: the launcher would say "signal"), and
// the message.
void expect_clear_exit(const std::string& mistake, const std::vector<std::string>& words) {
  const testing::ProcessResult r = launch_mistake(mistake);
  EXPECT_NE(r.exit_code, 0) << mistake << ":\n" << r.output;
  EXPECT_EQ(r.signal, 0) << mistake << ":\n" << r.output;
  EXPECT_FALSE(has(r.output, "signal")) << mistake << ": a rank was killed by a signal:\n" << r.output;
  EXPECT_TRUE(has(r.output, "ends on an uncaught exception (exit status 1)")) << mistake << ":\n" << r.output;
  for (const std::string& word : words) EXPECT_TRUE(has(r.output, word)) << mistake << ": no \"" << word << "\" in\n" << r.output;
}

TEST(FsdpOnNamedMembers, ShardingAMemberTwiceSaysItIsAUnitAlready) {
  expect_clear_exit("shard-twice", {"fully_shard: torch::nn::LinearImpl is an FSDP unit already"});
}

TEST(FsdpOnNamedMembers, WrappingAModelTwiceSaysToWrapItOnce) {
  expect_clear_exit("wrap-twice", {"FullyShardedDataParallel: unit 'fc1' belongs to another FullyShardedDataParallel"});
}

TEST(FsdpOnNamedMembers, CallingTheBareModuleSaysToCallFsdpForward) {
  expect_clear_exit("bare-module", {"sharded by FullyShardedDataParallel was probably called directly",
                                     "Call fsdp.forward(x)"});
}

TEST(FsdpOnNamedMembers, DdpsCheckpointRecipeSaysToCheckpointThroughFsdp) {
  expect_clear_exit("checkpoint", {"make_checkpoint: fc1.weight is sharded by FullyShardedDataParallel",
                                    "train::make_checkpoint(fsdp, optimizer, epoch)"});
}

}  // namespace
}  // namespace datapar
