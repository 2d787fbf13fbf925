// Element-wise reductions on the host, for the backends that reduce bytes themselves (the
// shared-memory collectives, MPI's ring): which dtypes they reduce (float32/64, int32/64
// natively; float16 and bfloat16 through float32 copies) and the reduction itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "datapar/reduce_op.h"

namespace datapar::detail {

// Throws InvalidArgumentError naming `what` unless the tensor's dtype can be reduced.
void check_reducible(const at::Tensor& tensor, const char* what);

// A contiguous tensor that reduce_into() takes: float16 and bfloat16 widened to float32,
// others contiguous (the tensor itself when it is contiguous already).
at::Tensor reducible(const at::Tensor& tensor);

// dst[0, n) op= src[0, n) for n elements of `type`, which must be float32/64 or int32/64
// (kAvg: the sum; the caller divides).
void reduce_into(void* dst, const void* src, int64_t n, at::ScalarType type, ReduceOp op);

}  // namespace datapar::detail
