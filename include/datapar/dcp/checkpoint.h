// Sharded checkpoints in PyTorch's torch.distributed.checkpoint (DCP) format: a directory
// with a .metadata file and one __<rank>_0.distcp data file per rank that wrote.
//
//   dcp::State state;
//   dcp::add_module(state, "model", *model);               // model.<name>: whole tensors
//   dcp::add_optimizer(state, "optim", optimizer, *model);  // optim.state.<name>.exp_avg, ...
//   state.put("progress.epoch", int64_t{3});
//   dcp::save(state, "ck/step-100", *group);                 // every rank, together
//   ...
//   dcp::load(state, "ck/step-100", *group);                 // fills the same entries in place
//
// Python reads it with torch.distributed.checkpoint.load({"model": ..., "optim": ...}) (the
// keys are PyTorch's get_state_dict names), and datapar loads what Python's dcp.save wrote.
// A tensor is either whole (the same on every rank: written once, by one rank) or a Shard
// (this rank's box of a global tensor); loading reshards: any saved boxes fill any requested
// ones, so a checkpoint saved by N ranks loads on M. docs/checkpoint_format.md has the format.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"
#include "datapar/optim/optimizer_state.h"

namespace datapar::dcp {

// This rank's box of a tensor of size `global_size`: local has sizes local.sizes() and
// starts at `offsets`.
struct Shard {
  at::Tensor local;
  std::vector<int64_t> offsets;
  std::vector<int64_t> global_size;
};

// The entries of a distributed state, by flattened name, in order.
class State {
 public:
  enum class Kind { kTensor, kShard, kValue };
  struct Entry {
    std::string name;
    Kind kind = Kind::kValue;
    // kTensor: one box, the whole tensor at offsets 0; kShard: this rank's boxes (any number,
    // none too), each a Shard of the tensor of `global_size`.
    std::vector<Shard> boxes;
    std::vector<int64_t> global_size;
    at::ScalarType dtype = at::kFloat;
    c10::IValue value;  // kValue: None, bool, int, float, str, or lists and tuples of them
    // The name's parts in Python's nested state ("optim", "state", "fc1.weight", "step"),
    // which Python's dcp_to_torch_save rebuilds; empty: the name is one flat key.
    std::vector<c10::IValue> path;
  };

  // A tensor that every rank holds whole and alike (a DDP model's parameter).
  void put(const std::string& name, at::Tensor whole, std::vector<c10::IValue> path = {});
  // This rank's shard of a tensor.
  void put(const std::string& name, Shard shard, std::vector<c10::IValue> path = {});
  // This rank's boxes of a tensor of `global_size` and `dtype` (several: FSDP's flat shards
  // hold a parameter's rows and part rows; none: it holds nothing of it).
  void put(const std::string& name, std::vector<Shard> boxes, std::vector<int64_t> global_size, at::ScalarType dtype,
           std::vector<c10::IValue> path = {});
  // A Python object (pickled in the checkpoint): the training progress, a hyperparameter.
  void put(const std::string& name, c10::IValue value, std::vector<c10::IValue> path = {});

  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<Entry>& entries() { return entries_; }
  // The entry named `name`; throws InvalidArgumentError if there is none.
  const Entry& at(const std::string& name) const;
  // Its tensor: the whole one, or this rank's first box.
  const at::Tensor& tensor(const std::string& name) const { return at(name).boxes.at(0).local; }

 private:
  Entry& add(const std::string& name, std::vector<c10::IValue> path);
  std::vector<Entry> entries_;
};

// Writes `state` as a DCP checkpoint into `dir` (created if missing). Every rank of `group`
// calls it with entries of the same names, kinds and global sizes (checked: an error names
// the first difference, on every rank). Each rank writes its shards and its share of the
// whole tensors and values into its own file; rank 0 writes .metadata last, atomically,
// once every rank's file is complete, so a save cut short (a rank killed) leaves a directory
// without .metadata, which load() refuses as incomplete. `dir` must not hold a checkpoint
// already: save each into its own directory, so that the last good one stays loadable.
// Throws CheckpointError (I/O, an existing checkpoint) or InvalidArgumentError (a state the
// ranks disagree on), on every rank alike.
void save(const State& state, const std::string& dir, ProcessGroup& group);
void save(const State& state, const std::string& dir);  // one process alone

// Fills `state`'s entries from the checkpoint in `dir`: each tensor and shard in place
// (copied into its existing tensor, converted to its dtype), each value replaced. Every
// rank reads only the byte ranges of the chunks that meet its boxes. Entries missing from
// the checkpoint are an error unless `allow_partial`. Throws CheckpointError for a missing,
// incomplete, damaged or hostile checkpoint, or one that does not fit `state` (sizes,
// kinds); every rank throws if any rank failed.
void load(State& state, const std::string& dir, ProcessGroup& group, bool allow_partial = false);
void load(State& state, const std::string& dir, bool allow_partial = false);  // one process alone

// True if `dir` holds a complete checkpoint (its .metadata reads and checks).
bool is_checkpoint(const std::string& dir) noexcept;
// Why `dir` is not one ("<dir>: no .metadata file: ...", a damaged or hostile metadata's
// reason); "" when it is.
std::string checkpoint_problem(const std::string& dir) noexcept;

// The names and global sizes of the tensors in a checkpoint, and the names of its values
// (size empty), in its order: what is there before deciding what to load.
struct SavedEntry {
  std::string name;
  bool is_tensor = false;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;
};
std::vector<SavedEntry> saved_entries(const std::string& dir);

// Every entry of the checkpoint in `dir`, whole (tensors on the CPU), on every rank: what
// Python's dcp_to_torch_save gives, for a state whose layout is known only from the file.
State load_all(const std::string& dir, ProcessGroup& group);
State load_all(const std::string& dir);  // one process alone

// The boxes that elements [begin, end) of a row-major tensor of `sizes` (flattened) make, in
// order: a part row, whole rows, a part row, recursively; each one contiguous in the
// flattened tensor (what FSDP's flat shards hold of a parameter). Each comes back as a
// Shard without `local`, its offsets in `offsets` and its sizes in `global_size`.
std::vector<Shard> flat_range_boxes(const std::vector<int64_t>& sizes, int64_t begin, int64_t end);

// ---- models and optimizers, in the names of PyTorch's get_state_dict ----

// Each parameter and buffer of `module` as a whole tensor "<prefix>.<name>".
void add_module(State& state, const std::string& prefix, torch::nn::Module& module);

// `optimizer`'s state (SGD, Adam, AdamW) over `module`'s parameters, as PyTorch's
// get_optimizer_state_dict names it: "<prefix>.state.<param>.<key>" (step, exp_avg,
// exp_avg_sq, momentum_buffer) and "<prefix>.param_groups.<i>.<key>" (lr, betas, ...,
// params: the parameter names). Optimizer state that does not exist yet (no step taken) is
// created as zeros first, as PyTorch does, so that load() has somewhere to put it.
void add_optimizer(State& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                   torch::nn::Module& module);

// After load(): puts the loaded "<prefix>." entries back into the optimizer (its
// hyperparameters and step counts; the state tensors were filled in place). The optimizer
// takes the state's tensors as they are, no copy: they are its own after add_optimizer, and
// a State of load_all's shares them with the optimizer from then on.
void apply_optimizer(const State& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                     torch::nn::Module& module);

// The same with an optimizer state in PyTorch's optimizer.state_dict() layout
// (optim/optimizer_state.h) whose parameters 0, 1, ... are named `names`; `adamw`: its
// groups are AdamW's (PyTorch's decoupled_weight_decay). The state's tensors are not copied.
void add_optimizer_state(State& state, const std::string& prefix, const OptimizerState& optimizer,
                         const std::vector<std::string>& names, bool adamw = false);
OptimizerState optimizer_state_of(const State& state, const std::string& prefix,
                                         const std::vector<std::string>& names);

}  // namespace datapar::dcp
