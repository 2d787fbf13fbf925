// State dicts: a module's parameters and buffers by their PyTorch names ("fc1.weight").
//
// The names are the bare module's, whatever wraps it: DataParallel and
// DistributedDataParallel report and accept the wrapped module's names, never
// "module."-prefixed ones, and loading strips the "module." prefix that a Python
// DataParallel or DDP checkpoint carries. Files are written in the format of torch.save (a
// zip with a pickled dict of tensors; docs/checkpoint_format.md), so Python's torch.load
// reads them (also with weights_only=True), and what Python's
// torch.save(model.state_dict(), path) writes loads here.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <string>

namespace datapar {

using StateDict = torch::OrderedDict<std::string, at::Tensor>;

// Parameters and buffers of `module` and its submodules, in PyTorch's order (each module's
// parameters, then its buffers, then its children's, depth first). The tensors are the
// module's own (no copy): detach or clone them to keep a snapshot.
StateDict state_dict(const torch::nn::Module& module);

// Copies `state` into `module`'s parameters and buffers (no autograd). Keys may carry a
// "module." prefix (Python DataParallel/DDP checkpoints); it is removed when every key has it.
// strict: every key must match and none may be missing; otherwise keys that match load and
// the rest are ignored. Throws InvalidArgumentError listing missing and unexpected keys
// (strict only), or naming the first tensor whose shape differs (always).
// A tensor of another dtype is converted to the parameter's, as PyTorch's load_state_dict
// does (param.copy_(saved)): loading float64 weights into a float32 model, or the reverse,
// is how models change precision. train::restore_checkpoint, which resumes a run and
// must continue it exactly, refuses a dtype mismatch instead.
void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true);

// Writes `state` to `path` atomically (temporary file in the same directory, fsync, rename,
// fsync of the directory): readers see the old file or the new one, never a torn write.
// Tensors may live on any device; the file holds CPU copies. Throws CheckpointError on I/O
// failure, leaving an existing file unchanged.
void save_state_dict(const StateDict& state, const std::string& path);

// Reads a file written by save_state_dict or by Python's torch.save(model.state_dict())
// (an OrderedDict; its _metadata is dropped) or torch.save(dict(...)); keys keep any
// "module." prefix, which load_state_dict removes. Tensors land on the CPU. Throws
// CheckpointError naming the file for a missing, truncated, damaged or foreign file.
StateDict load_state_dict_file(const std::string& path);

}  // namespace datapar
