// datapar train: trains a classifier on Fashion-MNIST (or synthetic images) in one of five
// modes, and reports per-epoch metrics.
//
//   single  one device, no parallelism: the reference
//   dp      DataParallel over --devices in this process; the global batch is split over them
//   ddp     DistributedDataParallel, one rank per process, under `datapar launch` (or
//           torchrun, mpirun, srun); each rank trains on global batch / world size
//           (--zero: the optimizer state sharded, ZeRO-1)
//   fsdp    FullyShardedDataParallel, one rank per process, each holding a shard of the
//           parameters, gradients and optimizer state
//   hsdp    hybrid sharding: fsdp within each group of --shard-size ranks (a machine's),
//           replicated across the groups (datapar/fsdp/hybrid_groups.h)
// and, under `datapar launch --fault-tolerant`, ddp or fsdp that goes on when a rank fails.
//
// plan_training() checks every option and the environment before anything is loaded or
// computed, so that bad options fail at once with a clear message (and exit code 2);
// train() then runs the plan. The trainer's parts are in train/ (train.cc lists them).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <initializer_list>
#include <optional>
#include <vector>

#include "datapar/devices.h"
#include "datapar/rendezvous/init_method.h"

namespace datapar::train {
class AsyncCheckpointWriter;
}  // namespace datapar::train

namespace datapar::tools {

// The command line, as given. Defaults are d2l's ResNet-18 settings where they apply.
struct TrainOptions {
  std::string model = "lenet";     // mlp, lenet, resnet18
  std::string data;                // IDX directory, "synthetic", or "" for the shipped subset
  int64_t epochs = 10;
  int64_t batch_size = 256;        // global batch (before --scale-lr)
  std::string optimizer = "sgd";   // sgd, adam, adamw (torch.optim's)
  std::optional<double> lr;        // unset: 0.1 for sgd (d2l's), 1e-3 for adam and adamw (torch.optim's)
  double momentum = 0;             // sgd only
  std::optional<double> weight_decay;  // unset: 0, or 0.01 for adamw (torch.optim.AdamW's)
  std::string mode = "single";     // single, dp, ddp, fsdp, hsdp
  std::string devices;             // "" = the mode's default (see plan_training)
  std::string backend;             // ddp only: gloo, nccl, mpi; empty: nccl on CUDA, else default_backend()
  std::string replicas = "shared"; // dp only: shared (CPU replicas share the parameters) or copy
  bool scale_lr = false;           // N devices or ranks: N x batch, N x lr
  uint64_t seed = 0;
  std::string checkpoint_dir;      // a checkpoint per epoch (rank 0 writes)
  std::string checkpoint_format = "torch";  // torch: a torch.save file per epoch; dcp: a DCP directory
  bool checkpoint_async = false;   // checkpoints written in the background (staged first)
  bool resume = false;             // continue from the latest checkpoint in checkpoint_dir
  bool start_over = false;         // resume: start from epoch 1 when no checkpoint is intact
  bool evaluate = false;           // only evaluate the latest checkpoint on the test set
  std::string metrics;             // JSON lines, one per epoch
  std::string plot;                // PNG of loss and accuracy per epoch
  std::string trace;               // Chrome trace of every step, all ranks (rank 0 writes)
  bool zero = false;               // ddp only: optimizer state sharded over the ranks (ZeRO-1)
  std::string comm_hook = "allreduce";  // ddp only: allreduce, bf16, fp16, powersgd:RANK[:START]
  int64_t sync_every = 0;          // ddp only: local SGD / DiLoCo, the ranks average every N steps (0: DDP)
  std::string outer_optimizer = "nesterov";  // --sync-every: nesterov (DiLoCo) or replace (local SGD)
  double outer_lr = 0.7;           // DiLoCo's outer step
  double outer_momentum = 0.9;
  int64_t fragments = 1;           // --sync-every: Streaming DiLoCo's fragments, synced in turn
  std::string outer_dtype = "float32";  // --sync-every: what the exchange sends: float32, bf16, int8
  bool fault_tolerant = false;     // ddp under datapar launch --fault-tolerant: goes on when a rank fails
  bool reshard = true;             // fsdp, hsdp: free each unit's parameters after its forward (ZeRO-3)
  std::string mp = "none";         // fsdp, hsdp: mixed precision, the parameters' compute dtype: none, bf16, fp16
  std::string amp = "none";
  bool cuda_graph = false;         // --cuda-graph: each step captured once and replayed (train/cuda_graph_step.h)        // autocast over each step's forward: none, bf16, fp16 (with a GradScaler)
  int shard_size = 0;              // hsdp: ranks per shard group (0: a machine's, LOCAL_WORLD_SIZE)
  bool checkpoint_activations = false;  // resnet18: recompute each residual block in backward
  std::string balance = "even";    // dp, ddp: even, auto (shares by measured speed), or weights "3,1"
  int64_t limit = 0;               // use only the first N train and N test samples (0: all)
  int64_t workers = 2;             // loader threads
  int threads = 0;                 // intra-op threads per process (0: cores / local ranks)
  double step_delay_ms = 0;        // --slow-step: each step of this process sleeps this long
};

// Whether `value` is one of a flag's accepted spellings.
inline bool one_of(const std::string& value, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (value == name) return true;
  }
  return false;
}

// Adds `train` and its flags to `app`; the flags write into `options`.
CLI::App* add_train_command(CLI::App& app, TrainOptions& options);

// --mode, parsed once by plan_training: the rest of the trainer compares this, not the flag.
enum class Mode { kSingle, kDataParallel, kDdp, kFsdp, kHsdp };
// The flag's spelling: "single", "dp", "ddp", "fsdp", "hsdp".
const char* mode_name(Mode mode);
// The parameters sharded (fsdp, hsdp): --mp and --no-reshard apply.
inline bool is_fully_sharded(Mode mode) { return mode == Mode::kFsdp || mode == Mode::kHsdp; }
// One rank per process (ddp, fsdp, hsdp), joined through a launcher.
inline bool has_ranks(Mode mode) { return mode == Mode::kDdp || is_fully_sharded(mode); }

// The options resolved against the machine and the launcher's environment.
struct TrainPlan {
  TrainOptions options;
  Mode mode = Mode::kSingle;
  std::vector<Device> devices;     // single: 1; dp: the replicas' devices; ddp: this rank's one
  std::string devices_label;       // every device of the job, e.g. "cpu:0,cpu:1"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int shard_size = 0;              // hsdp: ranks per shard group (--shard-size, or a machine's)
  int64_t parallelism = 1;         // devices (dp) or ranks (ddp) sharing a global batch
  int64_t global_batch = 0;        // after --scale-lr
  int64_t rank_batch = 0;          // what this process's loader reads per step
  double lr = 0;                   // after --scale-lr
  double weight_decay = 0;         // --weight-decay, or the optimizer's default
  std::string data_dir;            // "" for synthetic data
  std::vector<double> balance_weights;  // --balance W0,W1,...: one share per device (dp) or rank (ddp)
  bool resume = false;             // --resume, or a restart (DATAPAR_RESTART_COUNT > 0)
  // --checkpoint-async: the writer every checkpoint of the run goes through (made once the
  // job is joined: a dcp one has a group of its own).
  std::shared_ptr<train::AsyncCheckpointWriter> checkpoint_writer;
};

// The directory `--data` defaults to: $DATAPAR_FASHION_MNIST_DIR when set and not empty, else
// the subset shipped in the source tree this tool was built from (data/fashion-mnist; the
// tool's build, not the library, holds that path: see tools/datapar/CMakeLists.txt).
std::string default_data_dir(const Environment& env);

// Checks the options and resolves them. Reads no data and starts nothing. Throws
// InvalidArgumentError naming the option, the value and what to do instead, for: an
// unknown model, mode or backend; epochs < 1; lr <= 0; a batch smaller than the device or
// rank count (or, in ddp, one that does not split evenly over the ranks); a missing data
// directory; devices that do not exist or do not fit the mode; --mode ddp without a
// launcher's environment; --resume or --evaluate without --checkpoint-dir.
TrainPlan plan_training(const TrainOptions& options, const Environment& env = process_environment(),
                        const DeviceInventory& inventory = DeviceInventory::detect());

// Runs `datapar train`. Returns the exit code: 0 done, 2 bad options (the message is on
// stderr, before any work), 1 a failure while training.
int train(const TrainOptions& options);

}  // namespace datapar::tools
