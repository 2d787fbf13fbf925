// Which parameters share a gradient bucket. Only this: no tensors, no communication.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace datapar::detail {

// A bucket: parameter indices in the order their gradients fill it.
using BucketIndices = std::vector<size_t>;

// Packs `params`, taken in `order` (indices into params), into buckets: a bucket holds one
// dtype and device, and closes when it reaches its byte cap (the first bucket's cap is
// first_cap_bytes, the others' cap_bytes; a parameter larger than the cap gets a bucket
// of its own). A dtype or device change opens a new bucket. Buckets come out in order of
// their first parameter in `order`.
std::vector<BucketIndices> assign_buckets(const std::vector<at::Tensor>& params, const std::vector<size_t>& order,
                                          int64_t first_cap_bytes, int64_t cap_bytes);

// Indices of n parameters in reverse registration order: roughly the order backward
// produces their gradients, the best guess before the first iteration.
std::vector<size_t> reverse_order(size_t n);

}  // namespace datapar::detail
