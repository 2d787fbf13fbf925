// write_pickle: the data.pkl of a torch.save file, written the way Python's torch.save
// writes it, so that Python's torch.load reads it, also with weights_only=True (its
// restricted unpickler), and read_pickle reads it back.
//
// It emits plain protocol-2 opcodes only: EMPTY_DICT/SETITEMS, EMPTY_LIST/APPENDS, tuples,
// BINUNICODE, BININT*, LONG1, BINFLOAT, bools and None, and for each tensor
//   torch._utils._rebuild_tensor_v2(persistent storage, offset 0, size, stride, False, OrderedDict())
// with the persistent id ('storage', torch.<Type>Storage, "<n>", "cpu", numel). Unlike
// libtorch's torch::jit::pickle_save it adds no torch.jit._pickle type tags, which
// weights_only loading refuses. Nothing is memoized: every tensor gets its own storage
// (views are saved compact, shared storage is not preserved), which costs nothing for state
// dicts, whose tensors never share.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace datapar::detail {

// Serializes `root`: None, bool, int, double, string, tensor, and dicts (str, int, bool or
// double keys), lists and tuples of them, nested at most kMaxPickleDepth levels
// (pickle_limits.h; what read_pickle reads back). Storage n is storages[n]: a contiguous CPU
// tensor (perhaps a view) whose numel() elements from data_ptr() are the storage's bytes;
// write them to the archive as "data/<n>". Throws
// InvalidArgumentError for anything else (a sparse tensor, an object, a future) and for
// deeper nesting, which includes a dict or list inside itself.
std::string write_pickle(const c10::IValue& root, std::vector<at::Tensor>* storages);

}  // namespace datapar::detail
