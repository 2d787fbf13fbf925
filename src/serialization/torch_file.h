// torch_save / torch_load: files in the format of Python's torch.save (PyTorch >= 1.6),
// written and read without Python and without libtorch's version-specific pickle API.
//
// A file is a zip archive (stored, not compressed; records 64-byte aligned) of
//   <archive>/data.pkl     a protocol-2 pickle of the object (pickle_writer.h / pickle_reader.h)
//   <archive>/data/<key>   the raw bytes of each tensor storage, little-endian
//   <archive>/byteorder    "little"
//   <archive>/version      the zip format version
// The zip layer is caffe2::serialize::PyTorchStreamWriter/Reader, which libtorch uses for
// torch::save and has kept stable since 1.6. docs/checkpoint_format.md has the details.
// Not here: the legacy (pre-1.6, non-zip) format, TorchScript archives, and storages on
// devices other than the CPU (a file's tensors always load onto the CPU; move them after).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <string>

#include "serialization/pickle_limits.h"

namespace datapar::detail {

// Writes `root` (see write_pickle for what it may hold) to `path` atomically (AtomicFile:
// temporary file, fsync, rename, fsync of the directory). Tensors may be on any device;
// they are copied to the CPU as they are written. Throws CheckpointError on I/O failure,
// leaving any previous file at `path` unchanged, and InvalidArgumentError for a value that
// cannot be saved.
void torch_save(const c10::IValue& root, const std::string& path);

// Reads a file written by torch_save or by Python's torch.save, checking each record it
// reads against the archive's CRC-32 (zip_crc.h). Throws CheckpointError
// "<path>: <problem>. <hint>" for a missing, truncated, damaged or foreign file, or one
// holding Python objects other than containers, numbers, strings and tensors. `digest`, if
// given, receives the CRC-32 of the checked records' CRC-32s in the order read: equal files
// give equal digests, at no extra read.
c10::IValue torch_load(const std::string& path, uint32_t* digest = nullptr);

// torch_save into memory: the bytes of the file torch_save would write (Python's torch.load
// reads them from an io.BytesIO).
std::string torch_save_bytes(const c10::IValue& root);

// torch_save through `write(data, size)`, which returns the bytes it took (fewer: a failure
// the caller keeps for itself): the bytes of the file torch_save would write, streamed, with
// no copy of a tensor's. Returns their number.
uint64_t torch_save_to(const c10::IValue& root, const std::function<size_t(const void* data, size_t size)>& write);

// torch_load of an archive held in memory, data[0, size), with the same checks. Throws
// CheckpointError without a file name (the caller says where the bytes came from).
// `allowance`: the pickle memory allowance shared with other reads (pickle_limits.h).
c10::IValue torch_load_bytes(const char* data, size_t size, PickleAllowance* allowance = nullptr);

// Where torch_load_archive reads a storage: `place(key, dtype, numel)` returns a contiguous
// CPU tensor of that dtype and element count, the caller's own memory to read the record
// into, or an undefined tensor for a new one.
using StoragePlace = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

// Reads `n` bytes of an archive, from `offset` within it, into `out` (whole, or throws).
using ArchiveRead = std::function<void(uint64_t offset, char* out, uint64_t n)>;

// torch_load of an archive of `size` bytes read through `read` (a torch.distributed.checkpoint
// item: a byte range of a data file), record by record: the zip directory, data.pkl, then each
// storage straight into the tensor `place` gives it (no copy in between) or into a new one;
// every record checked against its CRC-32. A tensor built on a placed storage is a view of the
// caller's tensor. The same errors as torch_load_bytes.
c10::IValue torch_load_archive(uint64_t size, const ArchiveRead& read, const StoragePlace& place,
                               PickleAllowance* allowance = nullptr);

// True if `path` opens as a zip archive with a data.pkl record. Reads only the zip's central
// directory at the end of the file, so it is cheap and catches truncation, not damage inside.
bool torch_file_is_intact(const std::string& path) noexcept;

// A type name for messages: "dict", "list", "int", "Tensor", ...
std::string python_type_name(const c10::IValue& value);

}  // namespace datapar::detail
