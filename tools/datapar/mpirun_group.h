// The workers of one `datapar launch` attempt started through mpirun, so that they form an
// MPI job (the MPI backend: shared memory between the processes of one machine) while the
// launcher supervises them exactly as the workers it forks itself (worker_group.h).
//
//   datapar launch --  mpirun -n N  datapar launch-rank DIR --  PROGRAM ARGS
//   (MpirunGroup)      (MPI's runtime)  (run_mpirun_rank: one per rank)  (the worker)
//
// Each launch-rank process sets torchrun's variables from Open MPI's, forks PROGRAM with
// its output on the FIFOs DIR/R.out and DIR/R.err (the launcher prefixes it "[rank R] "),
// writes DIR/R.pid, forwards SIGINT / SIGTERM / SIGHUP to it, and when it ends writes
// DIR/R.exit ("CODE SIGNAL"); the launcher reads these files. PROGRAM is a child of
// launch-rank, which is mpirun's: MPI_Init in PROGRAM joins the MPI job all the same.
// Everything dies with the launcher: PR_SET_PDEATHSIG on mpirun, launch-rank and PROGRAM.
//
// Open MPI refuses root and more processes than cores unless told: the user asked for
// exactly these processes, so the launcher tells it (OMPI_ALLOW_RUN_AS_ROOT,
// rmaps_base_oversubscribe). Workers are not bound to cores (--bind-to none), as torchrun's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker_group.h"

namespace datapar::tools {

// mpirun's path: the one CMake found, else "mpirun" on PATH; empty if neither exists.
std::string find_mpirun();

// Sets, in this process's environment unless already set, what Open MPI needs to start
// the processes the user asked for: running as root, more processes than cores.
void allow_mpirun_as_asked();

class MpirunGroup : public Workers {
 public:
  // Starts `nproc` workers running `argv` through `mpirun`, each with `environment` plus
  // its RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK (0). Throws Error if
  // the FIFOs or mpirun cannot be made or started.
  MpirunGroup(const std::string& mpirun, const std::vector<std::string>& argv, int nproc,
              const std::vector<std::string>& environment);
  ~MpirunGroup() override;  // SIGKILLs what still runs; removes DIR

  WorkerEvents poll(std::chrono::milliseconds timeout) override;
  void signal_all(int sig) override;
  int running() const override;
  bool finished() const override;

 private:
  struct Rank {
    pid_t pid = -1;  // PROGRAM's, once DIR/R.pid exists
    bool ended = false;
  };
  std::string path(int rank, const char* suffix) const;

  std::string dir_;
  std::string shm_dir_;  // Open MPI's shared-memory segments (vader): removed with the job
  std::unique_ptr<WorkerGroup> mpirun_;  // one "worker": mpirun, its own output "[mpirun] "
  std::vector<Rank> ranks_;
  bool mpirun_ended_ = false;
  int mpirun_status_ = 0;  // its exit code, or 128 + signal
  std::chrono::steady_clock::time_point all_ended_at_{};
};

// `datapar launch-rank DIR -- PROGRAM ARGS`, run by mpirun for MpirunGroup: see above.
// Returns launch-rank's exit status: 0 once PROGRAM's end is reported (the launcher
// decides what it means), non-zero if it could not be started or reported.
int run_mpirun_rank(const std::string& dir, const std::vector<std::string>& program);

}  // namespace datapar::tools
