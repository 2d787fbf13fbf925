#include "local_job.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "child_process.h"
#include "launch.h"
#include "datapar/config.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/rendezvous/init_method.h"
#include "process_group/backends.h"

namespace datapar::tools {

namespace {

// This process's command line, as it was started, with this program's path first (a
// program run by name from PATH is found again even where PATH differs).
// `launcher`: how the user starts the ranks instead, should this fail (e.g. "mpirun -n 2").
std::vector<std::string> own_command_line(const std::string& tool, int nproc, const std::string& launcher) {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(file, arg, '\0');) args.push_back(arg);
  const std::string self = detail::this_program();
  DATAPAR_CHECK(!self.empty() && !args.empty(), tool, ": cannot read this program's command line to start its ",
                nproc, " processes. Start them yourself: ", launcher, " <the same command>");
  args.front() = self;
  return args;
}

// mpirun's path: the one CMake found, else "mpirun" on PATH; empty if neither exists.
std::string find_mpirun() {
  const std::string built = DATAPAR_MPIEXEC;  // found at build time
  if (!built.empty() && !detail::find_executable(built).empty()) return built;
  return detail::find_executable("mpirun");
}

// Open MPI refuses root (containers, CI) and more processes than cores unless told: the
// tool asked for these processes, so allow both, unless the user set them otherwise.
void allow_mpirun_as_asked() {
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", /*overwrite=*/0);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
}

// Runs this command line again as `mpirun -n nproc ...`: each copy then finds itself under
// a launcher. Returns only if mpirun cannot be started.
void exec_under_mpirun(int nproc, const std::string& tool) {
  DATAPAR_CHECK(DATAPAR_HAVE_MPI, tool, ": this build of datapar has no MPI backend (CMake found no MPI library). ",
                "Install libopenmpi-dev and openmpi-bin, then configure and build again.");
  std::string mpirun = find_mpirun();
  if (mpirun.empty()) mpirun = "mpirun";  // execvp fails below with the clear error
  const std::vector<std::string> command = own_command_line(tool, nproc, detail::str_cat("mpirun -n ", nproc));
  std::vector<std::string> args = {mpirun, "-n", std::to_string(nproc)};
  args.insert(args.end(), command.begin(), command.end());
  allow_mpirun_as_asked();
  std::string line;
  for (const std::string& a : args) line += (line.empty() ? "" : " ") + a;
  std::fprintf(stderr, "%s: starting %d processes: %s\n", tool.c_str(), nproc, line.c_str());
  std::fflush(nullptr);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  throw InvalidArgumentError(detail::str_cat(tool, ": cannot start ", mpirun, ": ", std::strerror(errno),
                                             ". Install Open MPI (apt-get install openmpi-bin), or start the ranks ",
                                             "yourself: mpirun -n ", nproc, " ", line.substr(line.find(command[0]))));
}

}  // namespace

std::string job_backend(const std::string& given) {
  if (!given.empty()) return given;
  if (DATAPAR_HAVE_NCCL && torch::cuda::is_available()) return "nccl";
  return default_backend();
}

int run_ranks(int nproc, const std::string& tool, const std::function<int(const std::string&, int, int)>& rank_main,
              const std::string& backend) {
  DATAPAR_CHECK(nproc >= 1 && nproc <= kMaxProcesses, "--nproc ", nproc, ": use 1 .. ", kMaxProcesses, " processes.");
  if (!backend.empty()) (void)detail::find_backend(backend);  // refuse a bogus one before forking ranks
  if (const auto identity = identity_from_environment()) {  // under a launcher
    // mpirun and srun give the local rank under their own names; the nccl group reads
    // LOCAL_RANK (datapar/process_group/nccl.h).
    if (std::getenv("LOCAL_RANK") == nullptr && identity->local_rank >= 0) {
      ::setenv("LOCAL_RANK", std::to_string(identity->local_rank).c_str(), 1);
    }
    return rank_main("env://", identity->rank, identity->world_size);
  }
  if ((backend.empty() ? default_backend() : backend) == "mpi") exec_under_mpirun(nproc, tool);
  // This process becomes the job's launcher, as `datapar launch --nproc-per-node nproc --
  // <this command>` would be: each worker finds itself under a launcher above, and a rank
  // that fails or a signal to this process stops them all (launch.h).
  LaunchOptions job;
  job.nproc_per_node = nproc;
  // cpu_bind stays "cores": each rank on its own share of the cores, as `datapar launch`
  // does by default. Unbound, a benchmark's ranks sometimes share a core and every
  // meeting point waits for a time slice (Note in launch.cc: a 4 KiB all_reduce 5 us in
  // some runs, 55-80 us in others, the same binary).
  job.program = own_command_line(tool, nproc, detail::str_cat("datapar launch --nproc-per-node ", nproc, " --"));
  job.who = tool;
  job.tag_output = false;  // rank 0 prints the tool's table, as a single process would
  return launch(job);
}

}  // namespace datapar::tools
