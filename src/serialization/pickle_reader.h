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

namespace datapar::detail {

// Returns the storage `key` (record "data/<key>" of the archive) as a flat CPU tensor of
// `numel` elements of `dtype`. Throws CheckpointError if the record is missing or has
// another size.
using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

// Runs the pickle in data[0, size). Throws CheckpointError("data.pkl: <problem> at byte N of M")
// for a malformed or truncated program, an object outside the subset above, or one past a
// limit of pickle_limits.h (nesting, values counted at each reference, string bytes; see
// Note [Pickle budget] in the .cc), and for a dict or list inside itself or changed after
// it was put into another (Python's pickler never writes either). The caller adds the
// file name. Memory and time grow with `size`, whatever the program says; the result
// nests at most kMaxPickleDepth levels and has no cycles.
c10::IValue read_pickle(const char* data, size_t size, const StorageLoader& load_storage);

// "Float" -> kFloat, as in the names torch.FloatStorage ... torch.BoolStorage; false if the
// name is not a storage type datapar reads.
bool scalar_type_from_storage_name(const std::string& name, at::ScalarType* type);

}  // namespace datapar::detail
