// Host copies of a state's tensors for a write in the background, kept from one save to the
// next: a save copies each tensor into the buffer the tensor at its place had last time when
// it still fits (the same sizes and dtype), so that after the first save staging allocates
// nothing and the step that saves pays for copies only, not for page faults. CUDA tensors go
// into pinned memory, as PyTorch's dcp.async_save stages them.
//
// One save at a time: the buffers are reused by the next begin(), so the write that reads
// them must have ended by then (BackgroundWriter::begin waits for it).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace datapar::detail {

class StagingMemory {
 public:
  // A new save: the buffers are handed out again from the first.
  void begin() { next_ = 0; }
  // A host copy of `t` (undefined for undefined), in the buffer of this place last time if
  // it fits.
  at::Tensor stage(const at::Tensor& t);
  // `v` with every tensor inside it (dicts, lists, tuples) staged; other values as they are.
  c10::IValue stage(const c10::IValue& v);
  // The bytes held for the staged copies.
  int64_t bytes() const;

 private:
  struct Buffer {
    at::Tensor tensor;
    bool pinned = false;
  };
  std::vector<Buffer> buffers_;
  size_t next_ = 0;
};

}  // namespace datapar::detail
