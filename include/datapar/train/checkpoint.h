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
//   auto last = train::latest_checkpoint(dir);                  // nullopt on a fresh start
//   int64_t first_epoch = 0;
//   if (last) {
//     train::Checkpoint c = train::load_checkpoint(*last, device);  // every rank, own device
//     train::restore_checkpoint(c, *model, optimizer);
//     first_epoch = c.epoch;
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

#include "datapar/state_dict.h"
#include "datapar/train/optimizer_state.h"
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
// one at a time). Throws CheckpointError on I/O failure (the previous file is unchanged).
bool save_checkpoint(const Checkpoint& checkpoint, const std::string& path, int64_t rank);

// Reads a checkpoint from save_checkpoint (or one Python wrote in the same layout), checks
// its structure, and moves the model and optimizer tensors onto `device` (every rank
// loads onto its own). RNG states stay on the CPU. Throws CheckpointError "<path>: <problem>"
// for a missing, truncated, damaged or foreign file, a wrong "format", a missing key or an
// entry of the wrong type.
Checkpoint load_checkpoint(const std::string& path, const c10::Device& device = c10::Device(c10::kCPU));

// Copies a loaded checkpoint into `model` (strict: same names and shapes; a "module."
// prefix is removed) and `optimizer` (left as it is if the checkpoint has no optimizer
// state), and sets the RNG state if `restore_rng`. Checks everything first: if it throws
// CheckpointError (naming the file and the first mismatch, e.g. a tensor's shape), model,
// optimizer and RNG are unchanged.
void restore_checkpoint(const Checkpoint& checkpoint, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                        bool restore_rng = true);

// "<dir>/checkpoint-epoch-<epoch>.pt", the names latest_checkpoint looks for.
std::string checkpoint_path(const std::string& dir, int64_t epoch);

// The checkpoint in `dir` with the highest epoch whose archive is intact (its zip directory
// reads back; this catches truncated and foreign files cheaply, without reading tensors),
// or nullopt if there is none or `dir` does not exist. Skips temporary files of
// interrupted writes. Safe to call on every rank.
std::optional<std::string> latest_checkpoint(const std::string& dir);

}  // namespace datapar::train
