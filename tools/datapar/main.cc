// The datapar command-line tool. Subcommands: devices, launch, train, bench collectives,
// bench ddp. Bad usage exits 2.
#include <CLI/CLI.hpp>

#include <cmath>
#include <iostream>
#include <string>

#include "bench_collectives.h"
#include "bench_ddp.h"
#include "datapar/config.h"
#include "datapar/devices.h"
#include "datapar/error.h"
#include "launch.h"
#include "train.h"

namespace {

int list_devices(const std::string& spec) {
  const datapar::DeviceInventory inventory = datapar::DeviceInventory::detect();
  if (!spec.empty()) {
    for (const datapar::Device& d : datapar::parse_devices(spec, inventory)) std::cout << d << "\n";
    return 0;
  }
  std::cout << "CPU: cpu:0 .. cpu:" << inventory.cpu_count - 1 << " (worker threads; " << inventory.cpu_cores
            << " cores)\n";
  std::cout << "CUDA: " << inventory.cuda_count << " visible device(s)";
  if (inventory.cuda_visible_devices_set) std::cout << " (CUDA_VISIBLE_DEVICES=" << inventory.cuda_visible_devices << ")";
  std::cout << "\n";
  for (int i = 0; i < inventory.cuda_count; ++i) std::cout << "  cuda:" << i << "\n";
  return 0;
}

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"datapar: data-parallel training for C++ on libtorch"};
  app.set_version_flag("--version", version_line());
  app.require_subcommand(0, 1);

  std::string spec;
  auto* devices = app.add_subcommand("devices", "List the devices datapar can use, or check a device list");
  devices->add_option("--devices", spec, "A device list to check, e.g. cpu:0,cpu:1 or cuda:0,cuda:3 or cuda");

  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  datapar::tools::BenchCollectivesOptions collectives;
  std::string sizes = "4KiB,64KiB,1MiB,4MiB,16MiB,64MiB";
  auto* bench_collectives = bench->add_subcommand(
      "collectives", "Time collectives over N local processes (or under a launcher), like nccl-tests");
  bench_collectives->add_option("--nproc", collectives.nproc, "Processes to start when not under a launcher (default 2)");
  bench_collectives->add_option("--backend", collectives.backend,
                                "Process group backend: gloo, nccl (CUDA builds; one GPU per process, cuda:LOCAL_RANK), or mpi (started through mpirun) (default: nccl where CUDA devices are visible, else mpi under mpirun, else gloo)");
  bench_collectives->add_option("--op", collectives.op, "all_reduce, broadcast or all_gather (default all_reduce)");
  bench_collectives->add_option("--sizes", sizes, "Bytes per process, e.g. 4KiB,1MiB,64MiB (default 4KiB..64MiB)");
  bench_collectives->add_option("--iters", collectives.iters, "Timed iterations per size (default 20)");
  bench_collectives->add_option("--warmup", collectives.warmup, "Untimed iterations per size (default 5)");

  datapar::tools::BenchDdpOptions ddp;
  auto* bench_ddp = bench->add_subcommand(
      "ddp", "Samples/s of DDP training steps over N local processes (or under a launcher), with the ceiling");
  bench_ddp->add_option("--model", ddp.model, "mlp, lenet or resnet18 (default mlp)");
  bench_ddp->add_option("--nproc", ddp.nproc, "Processes to start when not under a launcher (default 2)");
  bench_ddp->add_option("--batch", ddp.batch, "Batch per rank (default: mlp 64, lenet 128, resnet18 32)");
  bench_ddp->add_option("--backend", ddp.backend,
                        "Process group backend: gloo, nccl (CUDA builds; one GPU per process, cuda:LOCAL_RANK), or mpi (started through mpirun) (default: nccl where CUDA devices are visible, else mpi under mpirun, else gloo)");
  bench_ddp->add_option("--steps", ddp.steps, "Timed steps per phase (default: mlp 200, lenet 50, resnet18 10)");
  bench_ddp->add_option("--warmup", ddp.warmup, "Untimed steps per phase (default 5)");
  bench_ddp->add_option("--threads", ddp.threads, "Intra-op threads per process (default 1)");
  bench_ddp->add_flag("--gradient-as-bucket-view", ddp.gradient_as_bucket_view,
                      "DdpOptions::gradient_as_bucket_view: gradients are views of the buckets (no copies)");

  datapar::tools::LaunchOptions launch_options;
  double grace_s = 5;
  auto* launch = app.add_subcommand(
      "launch", "Run PROGRAM as the workers of a data-parallel job (torchrun's environment); see README, Launching");
  launch->footer("Usage: datapar launch --nproc-per-node N [options] -- PROGRAM [ARGS...]");
  launch->add_option("--nproc-per-node", launch_options.nproc_per_node, "Workers on this node (default 1)");
  launch->add_option("--nnodes", launch_options.nnodes, "Nodes in the job, one launcher each (default 1)");
  launch->add_option("--node-rank", launch_options.node_rank, "This node's number, 0 .. nnodes-1 (default 0)");
  launch->add_option("--master-addr", launch_options.master_addr,
                     "Address of node 0, where rank 0 serves the store (default 127.0.0.1)");
  launch->add_option("--master-port", launch_options.master_port,
                     "Port of the store on node 0 (default 0: a free port; required with --nnodes > 1)");
  auto* token = launch->add_option("--token", launch_options.token,
                                   "Store token, the same on every node; visible to other users in ps, so prefer "
                                   "--token-file (default: DATAPAR_STORE_TOKEN, else random on one node)");
  launch->add_option("--token-file", launch_options.token_file,
                     "File whose first line is the store token, the same on every node (chmod 600)");
  launch->add_option("--max-restarts", launch_options.max_restarts,
                     "Restart the whole group up to K times after a failure (default 0)");
  launch->add_option("--grace-period", grace_s,
                     "Seconds workers get to exit after SIGTERM before SIGKILL (default 5)");
  launch->add_option("--runner", launch_options.runner,
                     "fork (the default and only runner). For an MPI job run your own mpirun -np N PROGRAM "
                     "instead of datapar launch; for Slurm, srun");
  launch->add_option("--cpu-bind", launch_options.cpu_bind,
                     "cores (default): each forked worker runs on its own share of the launcher's cores, when "
                     "there are at least as many cores as workers; none: anywhere")
      ->check(CLI::IsMember({"cores", "none"}));
  launch->add_option("program", launch_options.program, "The program and its arguments, after --");
  datapar::tools::TrainOptions train_options;
  auto* train = datapar::tools::add_train_command(app, train_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;  // --help exits 0; usage errors exit 2
  }
  if (*train) return datapar::tools::train(train_options);
  try {
    if (*devices) return list_devices(spec);
    if (*launch) {
      // NaN compares false with everything: it would pass a sign check and become any
      // number of milliseconds.
      DATAPAR_CHECK(std::isfinite(grace_s) && grace_s >= 0 && grace_s <= 24 * 3600, "launch: --grace-period ", grace_s,
                    ": give the seconds between SIGTERM and SIGKILL, a number from 0 to 86400.");
      launch_options.grace_period = std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
      launch_options.token_on_command_line = token->count() > 0;
      return datapar::tools::launch(launch_options);
    }
    if (*bench_ddp) return datapar::tools::bench_ddp(ddp);
    if (*bench_collectives) {
      collectives.sizes = datapar::tools::parse_sizes(sizes);
      return datapar::tools::bench_collectives(collectives);
    }
    std::cout << app.help();
    return 0;
  } catch (const datapar::Error& e) {
    std::cerr << "datapar: " << e.what() << "\n";
    return 2;
  }
}
