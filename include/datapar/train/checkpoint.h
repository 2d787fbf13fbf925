// Training checkpoints: everything needed to resume a run so that it ends with the same
// parameters as a run that was never interrupted, in one file that Python can read.
//
// A checkpoint holds the model's state dict, the optimizer's state (PyTorch's
// optimizer.state_dict() layout, optimizer_state.h), the number of epochs completed, a
// free-form "progress" dict of integers (sampler seed and position, global step, ...), and
// the default random generators' states (rng_state.h). The file is a torch.save file
// holding a dict (docs/checkpoint_format.md):
//
//   {"format": "datapar.checkpoint/1", "model": {...}, "optimizer": {...}, "epoch": 3,
//    "progress": {"seed": 0, "consumed_samples": 1536}, "rng": {"cpu": T, "cuda": [T, ...]}}
//
// so that in Python torch.load(path)["model"] is the state dict of the equivalent module,
// and torch.load(path)["optimizer"] loads into the equivalent torch.optim optimizer.
//
// Typical use with DistributedDataParallel (every rank runs the same code):
//
//   auto last = train::load_latest_checkpoint(dir, rank, device);  // every rank, own device
//   for (const auto& d : last.damaged) std::cerr << d.problem << " Moved to " << d.moved_to << "\n";
//   int64_t first_epoch = 0;
//   if (last.checkpoint) {
//     train::restore_checkpoint(*last.checkpoint, *model, optimizer);
//     first_epoch = last.checkpoint->epoch;
//   } else if (!last.damaged.empty() || last.set_aside > 0) {
//     ... every checkpoint is damaged: stop, or start over only if the user said so
//   }
//   for (int64_t epoch = first_epoch; epoch < epochs; ++epoch) {
//     ... train one epoch ...
//     train::save_checkpoint(train::make_checkpoint(*model, optimizer, epoch + 1),
//                            train::checkpoint_path(dir, epoch + 1), rank);  // rank 0 writes
//   }
//
// Not covered: per-rank state that differs between ranks (each rank's RNG is restored from
// rank 0's file; derive per-rank randomness from a seed and the rank instead), learning-rate
// schedulers (keep their step in `progress`), and optimizers other than SGD, Adam, AdamW.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/jit_type.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "datapar/state_dict.h"
#include "datapar/optim/optimizer_state.h"
#include "datapar/train/rng_state.h"

namespace datapar::train {

// The value of "format" in the files this version writes and reads.
inline constexpr char kCheckpointFormat[] = "datapar.checkpoint/1";

// Named integers saved with a checkpoint: a sampler's "seed" and "consumed_samples", a
// global "step", a scheduler's "last_epoch". Each component picks its own keys.
using Progress = std::map<std::string, int64_t>;

struct Checkpoint {
  StateDict model;           // the bare module's state dict (no "module." prefix)
  // optimizer_state_dict() layout; no keys if saved without one.
  OptimizerState optimizer = OptimizerState(c10::AnyType::get(), c10::AnyType::get());
  int64_t epoch = 0;         // epochs completed: resume with epoch `epoch`
  Progress progress;
  RngState rng;
  std::string path;          // the file load_checkpoint read it from; empty otherwise
  uint32_t digest = 0;       // of the file's records, as load_checkpoint read them (equal files: equal digests)
};

// A checkpoint of `model`, `optimizer` and the RNG state now. The tensors are the live ones
// (no copy): save it before the next optimizer step. Throws InvalidArgumentError for an
// optimizer other than SGD, Adam or AdamW.
Checkpoint make_checkpoint(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer, int64_t epoch,
                           Progress progress = {});

// Writes `checkpoint` to `path` if rank == 0, and does nothing on other ranks (under DDP
// every rank holds the same model and optimizer state; one writer avoids N ranks racing
// on one file). Returns whether this call wrote the file. Does not synchronize: ranks
// other than 0 return at once, so put a barrier after it if they must read the file next.
// The write is atomic (temporary file in the same directory, fsync, rename, fsync of the
// directory): a crash or kill at any moment leaves the previous file at `path`, or none,
// never a torn one. Blocks for the write; tensors may be on any device (copied to the CPU
// one at a time). Throws CheckpointError on I/O failure (the previous file is unchanged),
// and, before writing anything, for an optimizer state that holds a dict or list inside
// itself or nests more than 200 levels (what a file may hold).
bool save_checkpoint(const Checkpoint& checkpoint, const std::string& path, int64_t rank);

// Reads a checkpoint from save_checkpoint (or one Python wrote in the same layout), checks
// its structure, and moves the model and optimizer tensors onto `device` (every rank
// loads onto its own). RNG states stay on the CPU. Throws CheckpointError "<path>: <problem>"
// for a missing, truncated, damaged or foreign file, a wrong "format", a missing key or an
// entry of the wrong type.
Checkpoint load_checkpoint(const std::string& path, const c10::Device& device = c10::Device(c10::kCPU));

// Copies a loaded checkpoint into `model` (strict: same names, shapes and dtypes; a
// "module." prefix is removed) and `optimizer` (left as it is if the checkpoint has no
// optimizer state), and sets the RNG state if `restore_rng`. Checks everything first: if
// it throws CheckpointError (naming the file and the first mismatch, e.g. a tensor's shape
// or dtype, or an optimizer state with a cycle), model, optimizer and RNG are unchanged.
// Unlike load_state_dict, which converts as PyTorch's does, a dtype mismatch is an error:
// a resumed run must continue the saved one exactly.
void restore_checkpoint(const Checkpoint& checkpoint, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                        bool restore_rng = true);

// "<dir>/checkpoint-epoch-<epoch>.pt", the names latest_checkpoint looks for.
std::string checkpoint_path(const std::string& dir, int64_t epoch);

// The checkpoint in `dir` with the highest epoch whose archive is intact (its zip directory
// reads back; this catches truncated and foreign files cheaply, without reading tensors),
// or nullopt if there is none or `dir` does not exist. Skips temporary files of
// interrupted writes and files moved aside as damaged. Safe to call on every rank. To
// resume, prefer load_latest_checkpoint, which reads every byte and falls back.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// A checkpoint file that did not load.
struct DamagedCheckpoint {
  std::string path;      // where it was
  std::string problem;   // why: torch_load's message, "<path>: <problem>. <hint>"
  std::string moved_to;  // its new name; empty where this call left it (rank != 0)
};

struct LatestCheckpoint {
  std::optional<Checkpoint> checkpoint;    // the newest one that loads; nullopt if none does
  std::vector<DamagedCheckpoint> damaged;  // the newer ones that did not, newest first
  // Files in `dir` moved aside as damaged, by this call or an earlier run's: if nothing
  // loads but this is > 0, the run had checkpoints, and starting over would lose it.
  int64_t set_aside = 0;
};

// Loads the newest checkpoint of `dir` that loads whole (load_checkpoint: every record
// against its CRC-32, the whole data.pkl), trying the next older one after each that does
// not. Note [Damaged checkpoints]: a checkpoint that does not load is damaged; it is
// reported in `damaged` and, by rank 0 only, renamed to "<path>.damaged" (".damaged.1",
// ... if taken; never replacing a file), so that the resumed run, which writes that epoch
// again, cannot overwrite it, and no later search tries it again. Other ranks leave files
// as they are (one renamer, no races) and skip a file that rank 0 moved meanwhile, so
// every rank loads the same checkpoint. Blocks for the reads; tensors go onto `device`.
// Throws CheckpointError for a file that cannot be opened (permissions: not damage, left
// alone), one that loads but is not a checkpoint of this format (another datapar
// version), and one rank 0 cannot rename. A missing `dir` has no checkpoints.
LatestCheckpoint load_latest_checkpoint(const std::string& dir, int64_t rank,
                                        const c10::Device& device = c10::Device(c10::kCPU));

}  // namespace datapar::train
