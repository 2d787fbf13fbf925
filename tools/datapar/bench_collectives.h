// datapar bench collectives: time collectives over a real process group, like nccl-tests.
#pragma once

#include <string>
#include <vector>

namespace datapar::tools {

struct BenchCollectivesOptions {
  int nproc = 2;                 // processes to start when not under a launcher
  std::string backend;  // gloo, mpi or nccl; empty: job_backend() (local_job.h)
  std::string op = "all_reduce";  // all_reduce | broadcast | all_gather
  std::vector<int64_t> sizes;     // bytes per process
  int iters = 20;
  int warmup = 5;
};

// Parses "4KiB,1MiB,64MiB" (B, KiB, MiB, GiB; KB/MB/GB as powers of 1000).
std::vector<int64_t> parse_sizes(const std::string& list);

// Runs the benchmark: under a launcher (torchrun's RANK and WORLD_SIZE, mpirun's
// OMPI_COMM_WORLD_*) as that rank, otherwise by starting nproc local processes: as their
// launcher (local_job.h) for gloo and nccl, through mpirun (which this program then
// becomes) for mpi. Rank 0 prints the table. Returns the exit status.
int bench_collectives(const BenchCollectivesOptions& options);

}  // namespace datapar::tools
