// scatter and gather: split a batch over devices, and put the per-device outputs back together.
//
// Both are ordinary differentiable tensor operations (narrow + copy, cat + copy), so
// gradients flow from the gathered output back to the scattered input. Inputs and outputs may
// be a tensor or any nesting of lists, tuples and string-keyed dicts of tensors (as
// c10::IValue); values that are not tensors reach every device unchanged.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <vector>

#include "datapar/devices.h"

namespace datapar {

// Splits `input` along `dim` and moves chunk i to devices[i].
// chunk_sizes empty: torch.chunk's rule (see chunk_sizes.h); fewer chunks than devices come
// back when the input has fewer rows than there are devices. chunk_sizes given: at most one
// size per device, each >= 1, summing to the rows along dim. Chunks on the input's own
// device are views (no copy). Throws InvalidArgumentError for a 0-dim tensor, a dim out of
// range, an empty batch or sizes that do not add up.
std::vector<at::Tensor> scatter(const at::Tensor& input, const std::vector<Device>& devices,
                                int64_t dim = 0, std::vector<int64_t> chunk_sizes = {});

// The same for a nested input: every tensor in it is split along `dim` with the same sizes,
// so every tensor must have the same number of rows along `dim`. Lists, tuples and dicts
// keep their shape in each chunk; other values are copied into every chunk.
std::vector<c10::IValue> scatter(const c10::IValue& input, const std::vector<Device>& devices,
                                 int64_t dim = 0, std::vector<int64_t> chunk_sizes = {});

// Concatenates per-device outputs along `dim` on `device`. 0-dim tensors (a loss per
// replica, say) are stacked into a vector with one entry per replica, as PyTorch does.
// Throws InvalidArgumentError for no outputs or shapes that cannot be concatenated.
at::Tensor gather(const std::vector<at::Tensor>& outputs, const Device& device, int64_t dim = 0);

// The same for nested outputs: every output must have the same structure; tensors at the
// same position are gathered, other values are taken from the first output.
c10::IValue gather(const std::vector<c10::IValue>& outputs, const Device& device, int64_t dim = 0);

// The number of rows along `dim` of the first tensor found in `input` (depth first), or -1
// when it holds no tensor.
int64_t batch_size(const c10::IValue& input, int64_t dim = 0);

}  // namespace datapar
