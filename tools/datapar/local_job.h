// Running a tool as a job of processes: under a launcher (RANK and WORLD_SIZE set, or
// mpirun's and srun's variables) this process is one rank; otherwise it forks `nproc`
// local ranks that meet on a loopback port, or, for the mpi backend, whose processes only
// MPI's launcher can start, runs this command line again under `mpirun -n nproc`.
#pragma once

#include <functional>
#include <string>

namespace datapar::tools {

// Calls rank_main(init_method, rank, world_size) for this process's rank or for each
// forked one; returns 0 when every rank returned 0. With backend "mpi" and no launcher,
// this process becomes mpirun (exec) and returns only if that fails (InvalidArgumentError).
int run_job(int nproc, const std::string& tool, const std::function<int(const std::string&, int, int)>& rank_main,
            const std::string& backend = "gloo");

}  // namespace datapar::tools
