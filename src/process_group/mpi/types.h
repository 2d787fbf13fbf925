// Tensors as MPI sees them: which dtypes MPI reduces (float32/64, int32/64 natively;
// float16 and bfloat16 through float32 copies, as MPI has neither) and how any dtype is
// moved when nothing is reduced (as unsigned integers of its element size). MPI counts
// are ints, so one call moves at most 2^31 - 1 elements.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"
#include "process_group/mpi/runtime.h"  // <mpi.h>, C API only

namespace datapar::detail::mpi {

// Throws InvalidArgumentError naming `what` unless the tensor's dtype can be reduced.
void check_reducible(const at::Tensor& tensor, const char* what);

// A contiguous tensor MPI can reduce: float16 and bfloat16 widened to float32, others
// contiguous (the tensor itself when it is contiguous already).
at::Tensor reducible(const at::Tensor& tensor);

// MPI's type for a reducible buffer's dtype, and MPI's op (kAvg: sum, divided afterwards).
MPI_Datatype reduce_type(const at::Tensor& buffer);
MPI_Op reduce_op(ReduceOp op);

// dst[0, n) op= src[0, n) for n elements of `type`, which must be float32/64 or int32/64
// (kAvg: the sum; the caller divides).
void reduce_into(void* dst, const void* src, int64_t n, at::ScalarType type, ReduceOp op);

// `count` as an MPI count. Throws InvalidArgumentError naming `what` past INT_MAX.
int mpi_count(int64_t count, const std::string& what);

// `numel` elements of buffer's dtype, as moved without reduction.
struct Moved {
  MPI_Datatype type;
  int count;
};
Moved moved(const at::Tensor& buffer, int64_t numel, const std::string& what);

// Copies consecutive numel-sized pieces of `flat` into `outputs`.
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& outputs);

}  // namespace datapar::detail::mpi
