// read_pickle: runs the pickle program of a torch.save file (its data.pkl) and returns the
// object it builds, as an IValue.
//
// This is a small pickle machine of our own, not torch::jit::Unpickler: libtorch 1.13's
// unpickler cannot build a collections.OrderedDict (what Python's model.state_dict() is),
// and its API differs between libtorch releases. It understands exactly what torch.save
// writes for state dicts and checkpoints:
//   dict, OrderedDict (its _metadata attribute is dropped), list, tuple, str, int, float,
//   bool, None, and tensors (torch._utils._rebuild_tensor_v2 over persistent storages),
// plus the torch.jit._pickle wrappers libtorch's own pickler adds. Anything else (a pickled
// nn.Module, numpy arrays, TorchScript classes) is refused with CheckpointError: no Python
// code runs and no object is built that the file names, so a hostile file cannot do more
// than fail to load.
//
// Python values map to IValues: dict -> GenericDict (Any, Any; insertion order kept),
// list -> GenericList (Any), tuple -> Tuple, str -> String, int -> Int (64 bit), float ->
// Double, bool -> Bool, None -> None, tensor -> CPU Tensor (views of one storage share it).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <functional>
#include <string>
#include <unordered_set>

#include "serialization/pickle_limits.h"

namespace datapar::detail {

// Returns the storage `key` (record "data/<key>" of the archive) as a flat CPU tensor of
// `numel` elements of `dtype`. Throws CheckpointError if the record is missing or has
// another size.
using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

// Python objects a pickle may build besides the data above, each named by its class:
// torch.distributed.checkpoint's .metadata is a tree of dataclasses (dcp/metadata.h). None
// runs any code; each is built as data, within the same budgets.
struct PickleClasses {
  // Built by NEWOBJ (class, args) or REDUCE (class, args) and filled by BUILD: reads as a
  // dict {"__class__": "module.Name", <the BUILD state's entries>}, or with "__state__":
  // <state> when the state is not a dict, and "__args__": <args> when there are any. A dict
  // keyed by such objects (DCP's storage_data) reads as {0: (key, value), 1: ...}, in order:
  // an object is no IValue dict key.
  std::unordered_set<std::string> objects;
  // Called by REDUCE with one argument, and read as that argument: torch.Size((3, 5)) ->
  // (3, 5).
  std::unordered_set<std::string> identities;
  // Path classes, called with the path's parts: PosixPath("/", "tmp", "ck") -> "/tmp/ck".
  std::unordered_set<std::string> paths;
  // Globals read as their name where a value is expected: torch.float32 -> "torch.float32".
  std::unordered_set<std::string> constants;
  // Enum classes whose members are read by builtins.getattr(Enum, "NAME") -> "Enum.NAME".
  std::unordered_set<std::string> enums;
};

// Runs the pickle in data[0, size). Throws CheckpointError("data.pkl: <problem> at byte N of M")
// for a malformed or truncated program, an object outside the subset above, or one past a
// limit of pickle_limits.h (nesting, values counted at each reference, string bytes; see
// Note [Pickle budget] in the .cc), and for a dict or list inside itself or changed after
// it was put into another (Python's pickler never writes either). The caller adds the
// file name. Memory and time grow with `size`, whatever the program says; the result
// nests at most kMaxPickleDepth levels and has no cycles.
// `classes`: what it may build besides plain data (none: torch.save's subset only).
// `allowance`: shared with other reads (pickle_limits.h); none: this read's own.
c10::IValue read_pickle(const char* data, size_t size, const StorageLoader& load_storage,
                        const PickleClasses* classes = nullptr, PickleAllowance* allowance = nullptr);

// "Float" -> kFloat, as in the names torch.FloatStorage ... torch.BoolStorage; false if the
// name is not a storage type datapar reads.
bool scalar_type_from_storage_name(const std::string& name, at::ScalarType* type);

}  // namespace datapar::detail
