// Jobs started by the user's own mpirun, without `datapar launch` (issue 14): each rank takes
// its rank and world size from Open MPI's variables. On the mpi backend the processes know
// each other through MPI and the store comes after the group; on gloo the store is where
// MASTER_ADDR and MASTER_PORT say (env://), as under torchrun.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "datapar/config.h"
#include "testing/jobs.h"
#include "testing/ports.h"
#include "testing/temp_dir.h"

namespace {

using namespace std::chrono_literals;
using datapar::testing::find_program;
using datapar::testing::JobResult;
using datapar::testing::run_job;
using datapar::testing::TempDir;
using datapar::testing::train_result;

std::string bin(const std::string& name) { return std::string(DATAPAR_BIN_DIR) + "/" + name; }

std::vector<std::string> train_args(const std::string& backend) {
  return datapar::testing::small_ddp_training(bin("datapar"), backend);
}

// `mpirun -np 2 PROGRAM...` as a user runs it in a container: as root, more ranks than cores.
std::vector<std::string> under_mpirun(const std::vector<std::string>& program) {
  std::vector<std::string> command = {find_program("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "2"};
  command.insert(command.end(), program.begin(), program.end());
  return command;
}

// The result the jobs below must reproduce: the same training under datapar launch.
const std::string& launched_result() {
  static const std::string result = [] {
    const TempDir dir("mpirun_job_test");
    const JobResult r = datapar::testing::launched_training(bin("datapar"), dir.path());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return train_result(r.output);
  }();
  return result;
}

std::string skip_reason() {
  if (find_program("mpirun").empty()) return "mpirun is not installed (apt-get install openmpi-bin)";
  return "";
}

TEST(MpirunJob, DdpTrainsOnMpiWithoutDataparLaunch) {
  if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  if (!DATAPAR_HAVE_MPI) GTEST_SKIP() << "this build of datapar has no mpi backend (CMake found no MPI)";
  const TempDir dir("mpirun_job_test");
  // Nothing of datapar launch's: no RANK, WORLD_SIZE, MASTER_ADDR, DATAPAR_BACKEND.
  const JobResult r = run_job(under_mpirun(train_args("mpi")), {}, dir.path() + "/mpirun.log", 120s);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << "every rank must exit 0:\n" << r.output;
  EXPECT_NE(r.output.find("2 ranks on mpi"), std::string::npos) << r.output;
  ASSERT_NE(train_result(r.output), "") << r.output;
  EXPECT_EQ(train_result(r.output), launched_result()) << r.output;
}

TEST(MpirunJob, DdpTrainsOnGlooWithTheStoreAtMasterAddrAndPort) {
  if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  const TempDir dir("mpirun_job_test");
  const datapar::ReservedPort port;
  const JobResult r = run_job(under_mpirun(train_args("gloo")),
                              {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port.port())},
                              dir.path() + "/mpirun.log", 120s);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << "every rank must exit 0:\n" << r.output;
  EXPECT_NE(r.output.find("2 ranks on gloo"), std::string::npos) << r.output;
  ASSERT_NE(train_result(r.output), "") << r.output;
  EXPECT_EQ(train_result(r.output), launched_result()) << r.output;
}

// A rank that stops responding (SIGSTOP: alive, holding its connections) under the user's
// own mpirun: the other fails its collective with the group's timeout error, and the job
// ends soon after instead of hanging, whatever the backend. Rank 0 must not wait for the
// stopped peer in MPI_Finalize (Note [Finalizing without a hung peer] in
// src/process_group/mpi/runtime.cc): once a collective of its own failed, its wait there is
// 10 s, after which mpirun ends the job (issue 27: it waited a second group timeout, so
// jobs with the default timeouts hung for 5.5-10 minutes).
class MpirunHungRank : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Backends, MpirunHungRank, ::testing::Values("mpi", "gloo"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST_P(MpirunHungRank, FailsTheOtherRankWithinTheTimeoutAndEndsTheJob) {
  if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  if (GetParam() == "mpi" && !DATAPAR_HAVE_MPI) GTEST_SKIP() << "this build of datapar has no mpi backend";
  const TempDir dir("mpirun_job_test");
  const datapar::ReservedPort port;
  constexpr int kTimeout = 20;  // long enough that waiting it twice shows
  const JobResult r = run_job(under_mpirun({bin("launch_probe"), "hang", GetParam(), std::to_string(kTimeout)}),
                              {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port.port())},
                              dir.path() + "/mpirun.log", 90s);
  EXPECT_FALSE(r.timed_out) << "the job hung; after 90 s:\n" << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 hangs now"), std::string::npos) << r.output;
  // Rank 0's error: the collective that did not finish within the group's timeout.
  EXPECT_NE(r.output.find("launch_probe: "), std::string::npos) << "no error from the waiting rank:\n" << r.output;
  EXPECT_NE(r.output.find("timeout of 20 s"), std::string::npos) << r.output;
  // The waiting rank names the hung one: shared memory sees who did not arrive; for MPI,
  // which cannot say, the group's stall inspector does.
  const std::string named = GetParam() == "gloo" ? "rank 1 did not arrive" : "rank(s) 1 (at ";
  EXPECT_NE(r.output.find(named), std::string::npos) << r.output;
  // The timeout, 10 s in MPI_Finalize, the start of two ranks and mpirun's teardown: under
  // twice the timeout even on a loaded machine, which a second timeout in MPI_Finalize
  // (20 + 20 + 10 s) cannot be.
  EXPECT_LT(r.seconds, 2 * kTimeout) << r.output;
}

}  // namespace
