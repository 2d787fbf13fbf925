// The datapar command-line tool's front end: `launch`, --version and --help, with no
// libtorch; `train`, `bench` and `devices` are handed to datapar-torch beside it (commands.h).
// Bad usage exits 2.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>

#include "child_process.h"
#include "cli_numbers.h"
#include "commands.h"
#include "datapar/config.h"
#include "datapar/error.h"
#include "launch.h"

namespace {

// What this build is: datapar's version and the Torch, standard and backends it was built with.
std::string version_line() {
  std::string line = std::string("datapar ") + DATAPAR_VERSION + ", built with Torch " + DATAPAR_TORCH_VERSION;
  line += DATAPAR_HAVE_CUDA ? std::string(" (CUDA, toolkit ") + DATAPAR_CUDA_TOOLKIT_VERSION + ")" : " (CPU)";
  line += ", C++" + std::to_string(DATAPAR_CXX_STANDARD) + "; backends: gloo";
  if (DATAPAR_GLOO_PLUGIN) line += " (system libgloo, as a plugin beside libtorch's own gloo)";
  if (DATAPAR_HAVE_MPI) line += ", mpi";
  if (DATAPAR_HAVE_NCCL) line += ", nccl";
  return line;
}

// Replaces this process with datapar-torch from this program's directory, with the same
// arguments (argv[0] too, so that messages name the command the user typed). Returns only
// when that fails, with the exit status to use.
int exec_torch_program(char** argv) {
  const std::string self = datapar::detail::this_program();
  const std::string path = self.substr(0, self.rfind('/') + 1) + datapar::tools::kTorchProgram;
  ::execv(path.c_str(), argv);
  std::cerr << "datapar: " << argv[1] << " runs in " << path << ", which cannot be started: " << std::strerror(errno)
            << ". It is built with this program (CMake target datapar_cli) into the same directory; build it again.\n";
  return 2;
}

// The first option of `datapar launch` before "--" that `launch` does not have ("" when
// every one is known, or the command is not launch): "--runner" of "launch --runner fork --
// cmd". A token that starts with '-' and a digit is a value (a negative number).
std::string unknown_launch_option(int argc, char** argv, CLI::App& launch) {
  int i = 1;
  while (i < argc && argv[i][0] == '-') ++i;  // the program's own options come before the command
  if (i >= argc || std::string(argv[i]) != "launch") return "";
  for (++i; i < argc; ++i) {
    const std::string token = argv[i];
    if (token == "--") break;
    if (token.size() < 2 || token[0] != '-' || (token[1] >= '0' && token[1] <= '9') || token[1] == '.') continue;
    const std::string name = token.substr(0, token.find('='));
    if (name == "-h" || name == "--help") continue;
    if (launch.get_option_no_throw(name) == nullptr) return name;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && datapar::tools::needs_torch(argv[1])) return exec_torch_program(argv);

  CLI::App app{"datapar: data-parallel training for C++ on libtorch"};
  app.set_version_flag("--version", version_line());
  app.require_subcommand(0, 1);
  // Listed for --help; parsed by datapar-torch, which the check above hands them to.
  app.add_subcommand("devices", datapar::tools::kDevicesSummary);
  app.add_subcommand("train", datapar::tools::kTrainSummary);
  app.add_subcommand("bench", datapar::tools::kBenchSummary);
  app.add_subcommand("analyze", datapar::tools::kAnalyzeSummary);

  datapar::tools::LaunchOptions launch_options;
  double grace_s = 5;
  auto* launch = app.add_subcommand("launch", datapar::tools::kLaunchSummary);
  launch->footer("Usage: datapar launch --nproc-per-node N [options] -- PROGRAM [ARGS...]");
  launch->add_option("--nproc-per-node", launch_options.nproc_per_node, "Workers on this node (default 1)")
      ->check(datapar::tools::whole_number<decltype(launch_options.nproc_per_node)>());
  launch->add_option("--nnodes", launch_options.nnodes, "Nodes in the job, one launcher each (default 1)")
      ->check(datapar::tools::whole_number<decltype(launch_options.nnodes)>());
  launch->add_option("--node-rank", launch_options.node_rank, "This node's number, 0 .. nnodes-1 (default 0)")
      ->check(datapar::tools::whole_number<decltype(launch_options.node_rank)>());
  launch->add_option("--master-addr", launch_options.master_addr,
                     "Address of node 0, where rank 0 serves the store (default 127.0.0.1)");
  launch->add_option("--master-port", launch_options.master_port,
                     "Port of the store on node 0 (default 0: a free port; required with --nnodes > 1)");
  auto* token = launch->add_option("--token", launch_options.token,
                                   "Store token, the same on every node; visible to other users in ps, so prefer "
                                   "--token-file (default: DATAPAR_STORE_TOKEN, else random on one node)");
  launch->add_option("--token-file", launch_options.token_file,
                     "File whose first line is the store token, the same on every node (chmod 600)");
  launch->add_option("--run-id", launch_options.run_id,
                     "The job's identity, the same on every node: stores serve their own run only "
                     "(default: DATAPAR_RUN_ID, else random on one node)");
  launch->add_option("--max-restarts", launch_options.max_restarts,
                     "Restart the whole group up to K times after a failure (default 0)");
  double ft_timeout_s = 5;
  launch->add_flag("--fault-tolerant", launch_options.fault_tolerant,
                   "The job goes on when a worker fails: node 0's launcher serves the store and decides the "
                   "membership, a failed worker alone is restarted by its node's launcher (--max-restarts times "
                   "each), the others go on; give it to every node's launcher; the program must be fault-tolerant "
                   "too (datapar train --fault-tolerant)");
  launch->add_option("--min-ranks", launch_options.min_ranks,
                     "--fault-tolerant: below this many workers the job stops (default 1)")
      ->check(datapar::tools::whole_number<decltype(launch_options.min_ranks)>());
  launch->add_option("--max-ranks", launch_options.max_ranks,
                     "--fault-tolerant: at most this many workers train at once (default: all of them)")
      ->check(datapar::tools::whole_number<decltype(launch_options.max_ranks)>());
  launch->add_option("--ft-timeout", ft_timeout_s,
                     "--fault-tolerant: seconds a worker may be silent (dead, hung, stopped) before the others go on "
                     "without it (default 5)");
  launch->add_option("--grace-period", grace_s,
                     "Seconds workers get to exit after SIGTERM before SIGKILL (default 5)");
  launch->add_option("--cpu-bind", launch_options.cpu_bind,
                     "cores (default): each forked worker runs on its own share of the launcher's cores, when "
                     "there are at least as many cores as workers; none: anywhere")
      ->check(CLI::IsMember({"cores", "none"}));
  launch->add_option("program", launch_options.program, "The program and its arguments, after --");

  // An unknown option before --: CLI11 takes its value for the program and reports the
  // program's arguments as "not expected" (issue 46); name the option instead.
  if (const std::string unknown = unknown_launch_option(argc, argv, *launch); !unknown.empty()) {
    std::cerr << "datapar launch: unknown option " << unknown << " (before --, the launcher's options; see "
              << "datapar launch --help)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;  // --help exits 0; usage errors exit 2
  }
  try {
    if (*launch) {
      // NaN compares false with everything: it would pass a sign check and become any
      // number of milliseconds.
      DATAPAR_CHECK(std::isfinite(grace_s) && grace_s >= 0 && grace_s <= 24 * 3600, "launch: --grace-period ", grace_s,
                    ": give the seconds between SIGTERM and SIGKILL, a number from 0 to 86400.");
      launch_options.grace_period = std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
      DATAPAR_CHECK(std::isfinite(ft_timeout_s) && ft_timeout_s >= 0.1 && ft_timeout_s <= 24 * 3600,
                    "launch: --ft-timeout ", ft_timeout_s, ": give seconds from 0.1 to 86400.");
      launch_options.ft_timeout = std::chrono::milliseconds(static_cast<int64_t>(ft_timeout_s * 1000));
      launch_options.token_on_command_line = token->count() > 0;
      return datapar::tools::launch(launch_options);
    }
    std::cout << app.help();
    return 0;
  } catch (const datapar::Error& e) {
    std::cerr << "datapar: " << e.what() << "\n";
    return 2;
  }
}
