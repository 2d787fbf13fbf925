// Running a tool as a job of processes: under a launcher (RANK and WORLD_SIZE set, or
// mpirun's and srun's variables) this process is one rank; otherwise it becomes the
// launcher of `nproc` local ranks, each this command line again (launch.h: a rank that
// fails stops the others, a signal reaches them all), or, for the mpi backend, whose
// processes only MPI's launcher can start, runs this command line again under
// `mpirun -n nproc`.
#pragma once

#include <functional>
#include <string>

namespace datapar::tools {

// The most processes a tool starts on one machine for one job (launch --nproc-per-node,
// bench --nproc): far above any machine's cores, low enough that a typo is an error rather
// than a fork bomb.
inline constexpr int kMaxProcesses = 1024;

// The backend of a tool's job: `given` if not empty, else nccl on a machine with CUDA
// devices (in a build with the nccl backend), else default_backend() (mpi under mpirun,
// else gloo). Call it in a rank, after the fork: asking whether CUDA devices exist starts
// CUDA, which a forked child could then not use.
std::string job_backend(const std::string& given);

// Under a launcher, calls rank_main(init_method, rank, world_size) for this process's rank
// and returns what it returns. Otherwise launches `nproc` ranks as `datapar launch` would
// (LOCAL_RANK, LOCAL_WORLD_SIZE and the rest set; no core binding; output untagged, other
// messages begin with `tool`) and returns 0 when every rank returned 0, else the failed
// rank's exit status. With backend "mpi" and no launcher, this process becomes mpirun
// (exec) and returns only if that fails (InvalidArgumentError); an empty backend is
// default_backend() here.
int run_ranks(int nproc, const std::string& tool, const std::function<int(const std::string&, int, int)>& rank_main,
              const std::string& backend = "gloo");

}  // namespace datapar::tools
