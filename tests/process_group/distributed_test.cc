#include "datapar/distributed.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <chrono>
#include <functional>

#include "child_process.h"
#include "datapar/config.h"
#include "datapar/error.h"
#include "datapar/process_group/mpi.h"
#include "datapar/process_group/nccl.h"
#include "testing/expect_throw.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank) in `size` forked processes; returns each one's exit code (-1: killed).
std::vector<int> fork_rank_exit_codes(int size, const std::function<int(int)>& fn) {
  std::vector<int> codes;
  for (const detail::ChildExit& e : detail::fork_ranks(size, fn, "distributed_test")) codes.push_back(e.exit_code);
  return codes;
}

TEST(Distributed, InitAllReduceSubgroupAndDestroy) {
  const testing::TempDir dir("distributed");
  const std::string url = "file://" + dir.path() + "/store";
  const auto codes = fork_rank_exit_codes(3, [&](int rank) {
    init_process_group("gloo", url, rank, 3, 30s);
    if (!is_initialized() || get_rank() != rank || get_world_size() != 3) return 1;
    at::Tensor t = at::full({4}, rank);
    default_group()->all_reduce(t)->wait();
    if (t[0].item<float>() != 3.0f) return 2;
    auto evens = new_group({0, 2});
    if ((rank == 1) != (evens == nullptr)) return 3;
    if (evens) {
      if (evens->size() != 2 || evens->rank() != rank / 2) return 4;
      at::Tensor e = at::full({2}, rank);
      evens->all_reduce(e)->wait();
      if (e[0].item<float>() != 2.0f) return 5;
    }
    destroy_process_group();
    return is_initialized() ? 6 : 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

TEST(Distributed, ClearErrorsBeforeAnyWorkStarts) {
  const testing::TempDir dir("distributed");
  const std::string url = "file://" + dir.path() + "/store";
  EXPECT_FALSE(is_initialized());
  EXPECT_THROW_MSG(get_rank(), InvalidArgumentError, "Call datapar::init_process_group() first");
  EXPECT_THROW_MSG(init_process_group("foo", "tcp://127.0.0.1:1", 0, 1, 1s), InvalidArgumentError,
                   "unknown backend \"foo\". Available in this build: gloo");
#if DATAPAR_HAVE_NCCL
  if (torch::cuda::device_count() == 0) {
    EXPECT_THROW_MSG(init_process_group("nccl", url, 0, 1, 10s), InvalidArgumentError,
                     "no CUDA device is visible. Use the gloo or mpi backend on CPUs.");
  }
#else
  EXPECT_THROW_MSG(init_process_group("nccl", "tcp://127.0.0.1:1", 0, 1, 1s), InvalidArgumentError,
                   "nccl backend is not available in this build");
  // The factory itself too (it was an undefined symbol), with no store needed to say so.
  EXPECT_THROW_MSG(new_nccl_process_group(nullptr, 0, 1), InvalidArgumentError,
                   "new_nccl_process_group: the nccl backend is not available in this build");
#endif
#if !DATAPAR_HAVE_MPI
  EXPECT_THROW_MSG(init_process_group("mpi", "tcp://127.0.0.1:1", 0, 1, 1s), InvalidArgumentError,
                   "mpi backend is not available");
  EXPECT_THROW_MSG(new_mpi_process_group(), InvalidArgumentError,
                   "new_mpi_process_group: the mpi backend is not available in this build");
#else
  // "mpi" itself is tested under mpirun (mpi_process_group_test.cc); here only the list.
  EXPECT_THROW_MSG(init_process_group("foo", "tcp://127.0.0.1:1", 0, 1, 1s), InvalidArgumentError,
                   DATAPAR_HAVE_NCCL ? "Available in this build: gloo, mpi, nccl." : "Available in this build: gloo, mpi.");
#endif
  EXPECT_THROW_MSG(init_process_group("gloo", "tcp://127.0.0.1", 0, 1, 1s), InvalidArgumentError, "HOST:PORT");
  EXPECT_FALSE(is_initialized());
  // A world of one needs no peers.
  init_process_group("gloo", url, 0, 1, 10s);
  EXPECT_THROW_MSG(init_process_group("gloo", "env://", 0, 1, 1s), InvalidArgumentError, "exists already");
  EXPECT_THROW_MSG(new_group({0, 0}), InvalidArgumentError, "listed twice");
  EXPECT_THROW_MSG(new_group({1}), InvalidArgumentError, "outside the job's [0, 1)");
  destroy_process_group();
  EXPECT_FALSE(is_initialized());
}

// What a program that names no backend gets: the user's DATAPAR_BACKEND, else mpi under
// mpirun, else gloo (datapar launch sets no backend).
TEST(Distributed, DefaultBackendFollowsTheUserElseMpirun) {
  ::unsetenv("DATAPAR_BACKEND");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("PMI_SIZE");
  EXPECT_EQ(default_backend(), "gloo");
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);  // as mpirun sets it
  EXPECT_EQ(default_backend(), DATAPAR_HAVE_MPI ? "mpi" : "gloo");
  ::setenv("DATAPAR_BACKEND", "gloo", 1);     // as a user sets it
  EXPECT_EQ(default_backend(), "gloo");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::setenv("DATAPAR_BACKEND", "foo", 1);
  EXPECT_EQ(default_backend(), "foo");
  EXPECT_THROW_MSG(init_process_group("", "tcp://127.0.0.1:1", 0, 1, 1s), InvalidArgumentError,
                   "unknown backend \"foo\"");
  ::unsetenv("DATAPAR_BACKEND");
  EXPECT_FALSE(is_initialized());
}

}  // namespace
}  // namespace datapar
