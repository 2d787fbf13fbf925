// datapar-torch: the subcommands of the datapar tool that need libtorch (devices, train,
// bench collectives, bench ddp), which the front end `datapar` hands to it (commands.h).
// Bad usage exits 2.
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <iostream>
#include <new>
#include <string>

#include "bench_collectives.h"
#include "bench_ddp.h"
#include "bench_fsdp.h"
#include "cli_numbers.h"
#include "commands.h"
#include "datapar/devices.h"
#include "datapar/process_group/flight_recorder.h"
#include "datapar/error.h"
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

// `bench collectives` and its flags, which write into `collectives` and `sizes`.
CLI::App* add_bench_collectives(CLI::App& bench, datapar::tools::BenchCollectivesOptions& collectives,
                                std::string& sizes) {
  auto* cmd = bench.add_subcommand(
      "collectives", "Time collectives over N local processes (or under a launcher), like nccl-tests");
  cmd->add_option("--nproc", collectives.nproc, "Processes to start when not under a launcher (default 2)")
      ->check(datapar::tools::whole_number<decltype(collectives.nproc)>());
  cmd->add_option("--backend", collectives.backend,
                                "Process group backend: gloo, nccl (CUDA builds; one GPU per process, cuda:LOCAL_RANK), or mpi (started through mpirun) (default: nccl where CUDA devices are visible, else mpi under mpirun, else gloo)");
  cmd->add_option("--op", collectives.op, "all_reduce, broadcast or all_gather (default all_reduce)");
  cmd->add_option("--sizes", sizes, "Bytes per process, e.g. 4KiB,1MiB,64MiB (default 4KiB..64MiB)");
  cmd->add_option("--iters", collectives.iters, "Timed iterations per size (default 20)")
      ->check(datapar::tools::whole_number<decltype(collectives.iters)>());
  cmd->add_option("--warmup", collectives.warmup, "Untimed iterations per size (default 5)")
      ->check(datapar::tools::whole_number<decltype(collectives.warmup)>());
  return cmd;
}

// `bench ddp` and its flags, which write into `ddp`.
CLI::App* add_bench_ddp(CLI::App& bench, datapar::tools::BenchDdpOptions& ddp) {
  auto* cmd = bench.add_subcommand(
      "ddp", "Samples/s of DDP training steps over N local processes (or under a launcher), with the ceiling");
  cmd->add_option("--model", ddp.model, "mlp, lenet or resnet18 (default mlp)");
  cmd->add_option("--nproc", ddp.nproc, "Processes to start when not under a launcher (default 2)")
      ->check(datapar::tools::whole_number<decltype(ddp.nproc)>());
  cmd->add_option("--batch", ddp.batch, "Batch per rank, up to 65536 (default: mlp 64, lenet 128, resnet18 32)")
      ->check(datapar::tools::whole_number<decltype(ddp.batch)>())
      ->check(CLI::Range(0, 65536));  // 2^31 filled a 16 GiB tensor, then aborted (issue 46)
  cmd->add_option("--backend", ddp.backend,
                        "Process group backend: gloo, nccl (CUDA builds; one GPU per process, cuda:LOCAL_RANK), or mpi (started through mpirun) (default: nccl where CUDA devices are visible, else mpi under mpirun, else gloo)");
  cmd->add_option("--steps", ddp.steps, "Timed steps per phase (default: mlp 200, lenet 50, resnet18 10)")
      ->check(datapar::tools::whole_number<decltype(ddp.steps)>());
  cmd->add_option("--warmup", ddp.warmup, "Untimed steps per phase (default 5)")
      ->check(datapar::tools::whole_number<decltype(ddp.warmup)>());
  cmd->add_option("--threads", ddp.threads, "Intra-op threads per process (default 1)")
      ->check(datapar::tools::whole_number<decltype(ddp.threads)>());
  cmd->add_flag("--gradient-as-bucket-view", ddp.gradient_as_bucket_view,
                      "DdpOptions::gradient_as_bucket_view: gradients are views of the buckets (no copies)");
  cmd->add_option("--optimizer", ddp.optimizer, "sgd (lr 0.01; the default) or adam (lr 1e-3), in every phase");
  cmd->add_flag("--zero", ddp.zero,
                      "Also time DDP steps with the optimizer state sharded (ZeroRedundancyOptimizer), and report "
                      "the state each rank holds");
  cmd->add_option("--comm-hook", ddp.comm_hook,
                  "Also time DDP steps whose gradients go through this hook (as datapar train's --comm-hook: bf16, "
                  "fp16, powersgd:RANK[:START], START at most --warmup) against plain ones, by turns, with the "
                  "gradient bytes each rank sends per step");
  cmd->add_option("--sync-every", ddp.sync_every,
                  "Also time local SGD / DiLoCo (datapar train's --sync-every) against plain DDP steps, by turns, "
                  "whole rounds of this many steps, with the bytes each rank sends per step over a round and in its "
                  "largest step")
      ->check(datapar::tools::whole_number<decltype(ddp.sync_every)>());
  cmd->add_option("--fragments", ddp.fragments, "--sync-every: Streaming DiLoCo's fragments (default 1)")
      ->check(datapar::tools::whole_number<decltype(ddp.fragments)>());
  cmd->add_option("--outer-dtype", ddp.outer_dtype, "--sync-every: float32 (default), bf16 or int8");
  cmd->add_option("--outer-optimizer", ddp.outer_optimizer, "--sync-every: nesterov (default, DiLoCo) or replace");
  cmd->add_flag("--fault-tolerant", ddp.fault_tolerant,
                      "Also time fault-tolerant DDP steps (ft::FaultTolerantDdp: a vote before each update) against "
                      "plain DDP steps on a group of the same kind (gloo only)");
  cmd->add_option("--trace", ddp.trace,
                        "Then time DDP steps with the timeline off and on in turn (its cost), and write the timeline "
                        "here (Chrome trace JSON)");
  return cmd;
}

// `bench fsdp` and its flags, which write into `fsdp`.
CLI::App* add_bench_fsdp(CLI::App& bench, datapar::tools::BenchFsdpOptions& fsdp) {
  auto* cmd = bench.add_subcommand(
      "fsdp", "Step time of fully sharded training against DDP's, and the memory each rank holds");
  cmd->add_option("--model", fsdp.model,
                         "mlp, mlp-large (784-4096-4096-4096-10: 147 MiB of parameters), lenet or resnet18 "
                         "(default mlp)");
  cmd->add_option("--nproc", fsdp.nproc, "Processes to start when not under a launcher (default 2)")
      ->check(datapar::tools::whole_number<decltype(fsdp.nproc)>());
  cmd->add_option("--batch", fsdp.batch, "Batch per rank, up to 65536 (default: mlp 64, lenet 128, resnet18 32)")
      ->check(datapar::tools::whole_number<decltype(fsdp.batch)>())
      ->check(CLI::Range(0, 65536));  // 2^31 filled a 16 GiB tensor, then aborted (issue 46)
  cmd->add_option("--backend", fsdp.backend, "gloo, or mpi (started through mpirun) (default: gloo)");
  cmd->add_option("--steps", fsdp.steps, "Timed steps per round (default: mlp 100, lenet 30, resnet18 5)")
      ->check(datapar::tools::whole_number<decltype(fsdp.steps)>());
  cmd->add_option("--warmup", fsdp.warmup, "Untimed steps of each (default 5)")
      ->check(datapar::tools::whole_number<decltype(fsdp.warmup)>());
  cmd->add_option("--rounds", fsdp.rounds, "DDP and FSDP timed in turn, this many rounds each (default 5)")
      ->check(datapar::tools::whole_number<decltype(fsdp.rounds)>());
  cmd->add_flag("--fault-tolerant", fsdp.fault_tolerant,
                       "Also time FSDP under fault tolerance (ft::FaultTolerantFsdp: each rank's shard kept by the "
                       "next rank too), and report what each rank keeps");
  cmd->add_flag("--hsdp", fsdp.hsdp,
                "Also time hybrid sharding: FSDP within each machine, replicated across machines; on ranks that "
                "span machines, count the bytes each variant sends over the machines' links");
  cmd->add_option("--shard-size", fsdp.shard_size,
                  "--hsdp: ranks per shard group (default: a machine's, the launcher's local world size)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", fsdp.threads, "Intra-op threads per process (default 1)")
      ->check(datapar::tools::whole_number<decltype(fsdp.threads)>());
  cmd->add_option("--optimizer", fsdp.optimizer, "adam (lr 1e-3; the default) or sgd (lr 0.01)");
  cmd->add_flag("--reshard,!--no-reshard", fsdp.reshard,
                       "Free each unit's parameters after its forward (the default) or keep them until backward");
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"datapar: data-parallel training for C++ on libtorch (the subcommands that need libtorch)"};
  app.require_subcommand(1);

  std::string spec;
  auto* devices = app.add_subcommand("devices", datapar::tools::kDevicesSummary);
  devices->add_option("--devices", spec, "A device list to check, e.g. cpu:0,cpu:1 or cuda:0,cuda:3 or cuda");

  std::string dumps;
  auto* analyze = app.add_subcommand("analyze", datapar::tools::kAnalyzeSummary);
  analyze->add_option("dir", dumps, "The directory of the dumps (DATAPAR_FLIGHT_RECORDER_DIR)")->required();

  auto* bench = app.add_subcommand("bench", datapar::tools::kBenchSummary);
  bench->require_subcommand(1);
  datapar::tools::BenchCollectivesOptions collectives;
  std::string sizes = "4KiB,64KiB,1MiB,4MiB,16MiB,64MiB";
  auto* bench_collectives = add_bench_collectives(*bench, collectives, sizes);
  datapar::tools::BenchDdpOptions ddp;
  auto* bench_ddp = add_bench_ddp(*bench, ddp);
  datapar::tools::BenchFsdpOptions fsdp;
  auto* bench_fsdp = add_bench_fsdp(*bench, fsdp);

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
    if (*analyze) {
      std::cout << datapar::analyze_flight_records(dumps) << "\n";
      return 0;
    }
    if (*bench_ddp) return datapar::tools::bench_ddp(ddp);
    if (*bench_fsdp) return datapar::tools::bench_fsdp(fsdp);
    if (*bench_collectives) {
      collectives.sizes = datapar::tools::parse_sizes(sizes);
      return datapar::tools::bench_collectives(collectives);
    }
    return 0;  // unreachable: one subcommand is required
  } catch (const datapar::Error& e) {
    std::cerr << "datapar: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {  // e.g. an allocation the machine cannot give: not an abort
    std::cerr << "datapar: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "datapar: out of memory\n";
    return 1;
  }
}
