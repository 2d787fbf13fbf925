// The .metadata file of a torch.distributed.checkpoint (DCP) directory: what each entry of
// the saved state is (a tensor's dtype, global size and chunks, or a pickled Python object)
// and where each chunk's bytes are (a byte range of a __<rank>_<n>.distcp file).
//
// The file is a Python pickle of torch.distributed.checkpoint.metadata.Metadata, a tree of
// dataclasses. parse_metadata reads it with the pickle machine of serialization/ (no code
// runs; only the classes DCP's metadata holds are built, as data, within the reader's
// budgets) and checks it whole: every chunk inside its tensor, chunks that do not overlap
// and cover it, every chunk with a storage range. write_metadata writes what Python's
// pickle.load builds into the same classes. docs/checkpoint_format.md has the layout.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace datapar::dcp::detail {

inline constexpr const char* kMetadataFile = ".metadata";
// DCP's Metadata.version that datapar reads and writes (PyTorch 2.4 to 2.15; tested: 2.15).
inline constexpr const char* kFormatVersion = "1.0.0";

// A box of a tensor: sizes[d] elements from offsets[d] in each dimension d.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

// Where a chunk's (or an object's) bytes are: a torch.save archive at [offset, offset +
// length) of the checkpoint's file relative_path.
struct StorageInfo {
  std::string relative_path;
  int64_t offset = 0;
  int64_t length = 0;
};

struct Entry {
  std::string fqn;  // the flattened key: "model.fc1.weight", "optim.state.fc1.weight.exp_avg"
  bool is_tensor = false;
  // A tensor (TensorStorageMetadata):
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
  // One per chunk, in the order of `chunks`; for an object (BytesStorageMetadata), one.
  std::vector<StorageInfo> storage;
  // The key's path in the nested state (planner_data): ("optim", "state", "fc1.weight",
  // "step"), str and int parts. Empty if the file has none.
  std::vector<c10::IValue> path;
};

struct Metadata {
  std::vector<Entry> entries;  // in the file's order
  std::string save_id;         // StorageMeta.save_id, "" if none
  const Entry* find(const std::string& fqn) const;
};

// Reads and checks data[0, size). Throws CheckpointError saying what is wrong (the caller
// adds the file name).
Metadata parse_metadata(const char* data, size_t size);

// The .metadata pickle of `metadata`; `checkpoint_id` is recorded as StorageMeta.checkpoint_id.
std::string write_metadata(const Metadata& metadata, const std::string& checkpoint_id);

// "torch.float32" <-> at::kFloat, as DCP's TensorProperties names dtypes.
bool scalar_type_from_torch_name(const std::string& name, at::ScalarType* type);
std::string torch_dtype_name(at::ScalarType type);

// Elements of a box, or -1 past 2^62.
int64_t volume(const std::vector<int64_t>& sizes);

}  // namespace datapar::dcp::detail
