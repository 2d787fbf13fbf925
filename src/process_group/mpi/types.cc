// See types.h.
#include "process_group/mpi/types.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <climits>

#include "datapar/error.h"

namespace datapar::detail::mpi {

MPI_Datatype reduce_type(const at::Tensor& buffer) {
  switch (buffer.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    default: DATAPAR_INTERNAL_ASSERT(false, "not reducible: ", buffer.scalar_type());
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;  // then divided by size()
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
  }
  return MPI_SUM;
}

int mpi_count(int64_t count, const std::string& what) {
  if (count > INT_MAX) {
    throw InvalidArgumentError(str_cat(what, ": ", count, " elements are more than one MPI call takes (2^31 - 1). ",
                                       "Split the tensor into smaller ones."));
  }
  return static_cast<int>(count);
}

// Unsigned integers of the element's size: any dtype moves (bool, complex, float16, ...).
Moved moved(const at::Tensor& buffer, int64_t numel, const std::string& what) {
  switch (buffer.element_size()) {
    case 2: return {MPI_UINT16_T, mpi_count(numel, what)};
    case 4: return {MPI_UINT32_T, mpi_count(numel, what)};
    case 8: return {MPI_UINT64_T, mpi_count(numel, what)};
    default: return {MPI_BYTE, mpi_count(numel * static_cast<int64_t>(buffer.element_size()), what)};
  }
}

}  // namespace datapar::detail::mpi
