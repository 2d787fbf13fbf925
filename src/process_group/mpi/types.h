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
#include "collectives/reduce.h"

namespace datapar::detail::mpi {

// Reductions on the host: collectives/reduce.h.
using detail::check_reducible;
using detail::reduce_into;
using detail::reducible;

// MPI's type for a reducible buffer's dtype, and MPI's op (kAvg: sum, divided afterwards).
MPI_Datatype reduce_type(const at::Tensor& buffer);
MPI_Op reduce_op(ReduceOp op);

// `count` as an MPI count. Throws InvalidArgumentError naming `what` past INT_MAX.
int mpi_count(int64_t count, const std::string& what);

// `numel` elements of buffer's dtype, as moved without reduction.
struct Moved {
  MPI_Datatype type;
  int count;
};
Moved moved(const at::Tensor& buffer, int64_t numel, const std::string& what);

}  // namespace datapar::detail::mpi
