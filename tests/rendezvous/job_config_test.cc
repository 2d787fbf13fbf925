// The job's configuration, resolved once from an Environment (rendezvous/job_config.h), and
// the entry points that take it instead of reading the process environment.
#include "datapar/rendezvous/job_config.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>

#include "datapar/config.h"
#include "datapar/devices.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/ft/launched_job.h"
#include "datapar/rendezvous/init_method.h"
#include "testing/expect_throw.h"
#include "testing/fake_env.h"
#include "testing/ports.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;
using testing::fake_env;

TEST(JobConfig, NothingSetGivesTheDefaults) {
  const JobConfig c = resolve_job_config(fake_env({}));
  EXPECT_FALSE(c.launcher);
  EXPECT_TRUE(c.launcher_error.empty());
  EXPECT_FALSE(c.identity());
  EXPECT_FALSE(c.master_addr);
  EXPECT_FALSE(c.master_port);
  EXPECT_EQ(c.store_token, "");
  EXPECT_EQ(c.run_id, "");
  EXPECT_EQ(c.backend, "");
  EXPECT_FALSE(c.under_mpi_launcher);
  EXPECT_FALSE(c.gloo_hostname);
  EXPECT_TRUE(c.gloo_shared_memory);
  EXPECT_TRUE(c.mpi_shared_memory);
  EXPECT_FALSE(c.local_rank);
  EXPECT_EQ(default_backend(c), "gloo");
}

TEST(JobConfig, Torchrun) {
  const JobConfig c = resolve_job_config(fake_env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                                   {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"},
                                                   {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(c.identity());
  EXPECT_EQ(c.identity()->source, "torchrun");
  EXPECT_EQ(c.identity()->rank, 3);
  EXPECT_EQ(c.identity()->world_size, 8);
  EXPECT_EQ(c.identity()->local_world_size, 2);
  EXPECT_EQ(c.master_addr, "10.0.0.1");
  EXPECT_EQ(c.master_port, "29500");
  EXPECT_EQ(c.local_rank, "1");  // the nccl group's GPU
  EXPECT_FALSE(c.under_mpi_launcher);
  EXPECT_EQ(default_backend(c), "gloo");
}

TEST(JobConfig, OpenMpiChoosesMpiWhereThisBuildHasIt) {
  const JobConfig c = resolve_job_config(fake_env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  ASSERT_TRUE(c.identity());
  EXPECT_EQ(c.identity()->source, "Open MPI");
  EXPECT_EQ(c.identity()->local_rank, 1);
  EXPECT_TRUE(c.under_mpi_launcher);
  EXPECT_FALSE(c.local_rank);  // mpirun sets no LOCAL_RANK
  EXPECT_EQ(default_backend(c), DATAPAR_HAVE_MPI ? "mpi" : "gloo");
  // MPICH and srun with PMI set PMI_SIZE; a backend named by the user or the launcher wins.
  EXPECT_TRUE(resolve_job_config(fake_env({{"PMI_SIZE", "2"}})).under_mpi_launcher);
  EXPECT_EQ(default_backend(resolve_job_config(fake_env({{"OMPI_COMM_WORLD_SIZE", "2"}, {"DATAPAR_BACKEND", "gloo"}}))),
            "gloo");
  EXPECT_EQ(default_backend(resolve_job_config(fake_env({{"DATAPAR_BACKEND", ""}}))), "gloo");  // empty: unset
}

TEST(JobConfig, Slurm) {
  const JobConfig c = resolve_job_config(fake_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"},
                                                   {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "3"}}));
  ASSERT_TRUE(c.identity());
  EXPECT_EQ(c.identity()->source, "Slurm");
  EXPECT_EQ(c.identity()->rank, 5);
  EXPECT_EQ(c.identity()->world_size, 6);
  EXPECT_EQ(c.identity()->local_world_size, 3);
}

// Resolving never throws; the step that needs rank and world size does, with the message.
TEST(JobConfig, LauncherVariablesThatDoNotParseFailWhereTheyAreNeeded) {
  const JobConfig c = resolve_job_config(fake_env({{"RANK", "one"}, {"WORLD_SIZE", "2"}}));
  EXPECT_FALSE(c.launcher);
  EXPECT_THROW_MSG(c.identity(), InvalidArgumentError, "RANK=\"one\" is not a valid integer");
  EXPECT_THROW_MSG(rendezvous("tcp://127.0.0.1:1", -1, -1, 1s, c), InvalidArgumentError,
                   "RANK=\"one\" is not a valid integer");
}

TEST(JobConfig, SharedMemoryAndNcclFailureSwitchesTokenRunIdAndGlooHostname) {
  const JobConfig off = resolve_job_config(fake_env({{"DATAPAR_SHM", "0"}, {"DATAPAR_MPI_SHM", "0"}}));
  EXPECT_FALSE(off.gloo_shared_memory);
  EXPECT_FALSE(off.mpi_shared_memory);
  const JobConfig on = resolve_job_config(fake_env({{"DATAPAR_SHM", "1"}, {"DATAPAR_MPI_SHM", "yes"}}));
  EXPECT_TRUE(on.gloo_shared_memory);
  EXPECT_TRUE(on.mpi_shared_memory);
  EXPECT_TRUE(on.nccl_end_process_on_failure);  // unset: a failure after wait() ends the process
  EXPECT_FALSE(resolve_job_config(fake_env({{"DATAPAR_NCCL_END_PROCESS_ON_FAILURE", "0"}})).nccl_end_process_on_failure);

  const JobConfig token = resolve_job_config(fake_env({{"DATAPAR_STORE_TOKEN", "s3cret"}}));
  EXPECT_EQ(token.store_token, "s3cret");
  EXPECT_EQ(token.run_id, "s3cret");  // a FileStore's run id falls back to the token
  const JobConfig run = resolve_job_config(fake_env({{"DATAPAR_STORE_TOKEN", "s3cret"}, {"DATAPAR_RUN_ID", "run-7"}}));
  EXPECT_EQ(run.run_id, "run-7");
  EXPECT_EQ(resolve_job_config(fake_env({{"DATAPAR_GLOO_HOSTNAME", "node3"}})).gloo_hostname, "node3");
}

// init_process_group with a JobConfig reads no environment: env:// from the config alone.
// What `datapar launch --fault-tolerant` tells its workers, and the membership options both
// sides derive from it (the launcher's decider and each worker's member).
TEST(JobConfig, AFaultTolerantLaunchersNumbersAndTheOptionsDerivedFromThem) {
  const JobConfig c = resolve_job_config(fake_env({{"DATAPAR_FAULT_TOLERANT", "1"},
                                                   {"DATAPAR_FT_TIMEOUT_MS", "2000"},
                                                   {"DATAPAR_FT_MIN_RANKS", "2"},
                                                   {"DATAPAR_FT_MAX_RANKS", "4"},
                                                   {"GROUP_RANK", "1"}}));
  const FaultToleranceConfig ft = c.fault_tolerant_launcher();
  EXPECT_EQ(ft.timeout, 2000ms);
  EXPECT_EQ(ft.min_ranks, 2);
  EXPECT_EQ(ft.max_ranks, 4);
  EXPECT_EQ(ft.node_rank, 1);
  const ft::FtOptions o = ft::launched_job_options(ft, 3);
  EXPECT_EQ(o.eviction_timeout, 2000ms);
  EXPECT_EQ(o.heartbeat_interval, 200ms);
  EXPECT_EQ(o.settle_time, 400ms);
  EXPECT_EQ(o.quorum_timeout, 60s);
  EXPECT_EQ(o.expected_members, 3);
  EXPECT_EQ(o.min_members, 2);
  EXPECT_EQ(o.max_members, 4);
  EXPECT_EQ(ft::launched_group_timeout(o), 30s);

  // Not started by such a launcher, or its numbers missing: a worker's join says what to do.
  EXPECT_FALSE(resolve_job_config(fake_env({})).fault_tolerance);
  EXPECT_THROW_MSG(ft::join_launched_job(resolve_job_config(fake_env({}))), InvalidArgumentError,
                   "this process was not started by datapar launch --fault-tolerant");
  EXPECT_THROW_MSG(
      ft::join_launched_job(resolve_job_config(fake_env({{"DATAPAR_FAULT_TOLERANT", "1"}, {"DATAPAR_FT_TIMEOUT_MS", "x"}}))),
      InvalidArgumentError, "DATAPAR_FT_TIMEOUT_MS=\"x\" is not a valid integer.");
  EXPECT_THROW_MSG(ft::join_launched_job(resolve_job_config(fake_env({{"DATAPAR_FAULT_TOLERANT", "1"},
                                                                      {"DATAPAR_FT_TIMEOUT_MS", "1000"},
                                                                      {"DATAPAR_FT_MIN_RANKS", "1"}}))),
                   InvalidArgumentError, "DATAPAR_FT_MAX_RANKS is not set; datapar launch --fault-tolerant sets it.");
}

TEST(JobConfig, InitProcessGroupTakesTheConfigInsteadOfTheEnvironment) {
  const ReservedPort port;
  const JobConfig c = resolve_job_config(fake_env({{"MASTER_ADDR", "127.0.0.1"},
                                                   {"MASTER_PORT", std::to_string(port.port())},
                                                   {"RANK", "0"}, {"WORLD_SIZE", "1"},
                                                   {"DATAPAR_SHM", "0"}, {"DATAPAR_BACKEND", "gloo"}}));
  init_process_group("", "env://", -1, -1, 30s, c);
  EXPECT_EQ(get_rank(), 0);
  EXPECT_EQ(get_world_size(), 1);
  at::Tensor t = at::ones({3});
  default_group()->all_reduce(t)->wait();
  EXPECT_TRUE(at::equal(t, at::ones({3})));
  destroy_process_group();
}

TEST(JobConfig, CudaVisibleDevicesComesThroughTheEnvironmentGiven) {
  const DeviceInventory none = DeviceInventory::detect(fake_env({}));
  EXPECT_FALSE(none.cuda_visible_devices_set);
  const DeviceInventory narrowed = DeviceInventory::detect(fake_env({{"CUDA_VISIBLE_DEVICES", "1,0"}}));
  EXPECT_TRUE(narrowed.cuda_visible_devices_set);
  EXPECT_EQ(narrowed.cuda_visible_devices, "1,0");
}

}  // namespace
}  // namespace datapar
