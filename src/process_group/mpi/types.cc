// See types.h.
#include "process_group/mpi/types.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <climits>

#include "datapar/error.h"

namespace datapar::detail::mpi {
namespace {

template <typename T>
void reduce_span(T* __restrict dst, const T* __restrict src, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
      return;
    case ReduceOp::kProduct:
      for (int64_t i = 0; i < n; ++i) dst[i] *= src[i];
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
      return;
  }
}

bool is_reducible(at::ScalarType type) {
  return type == at::kFloat || type == at::kDouble || type == at::kInt || type == at::kLong || type == at::kHalf ||
         type == at::kBFloat16;
}

}  // namespace

void check_reducible(const at::Tensor& tensor, const char* what) {
  DATAPAR_CHECK(is_reducible(tensor.scalar_type()), what, ": reductions of ", tensor.scalar_type(),
                " tensors are not supported. Use float32/64, float16, bfloat16, int32 or int64.");
}

at::Tensor reducible(const at::Tensor& tensor) {
  const at::ScalarType type = tensor.scalar_type();
  return type == at::kHalf || type == at::kBFloat16 ? tensor.to(at::kFloat) : tensor.contiguous();
}

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

void reduce_into(void* dst, const void* src, int64_t n, at::ScalarType type, ReduceOp op) {
  switch (type) {
    case at::kFloat: return reduce_span(static_cast<float*>(dst), static_cast<const float*>(src), n, op);
    case at::kDouble: return reduce_span(static_cast<double*>(dst), static_cast<const double*>(src), n, op);
    case at::kInt: return reduce_span(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op);
    case at::kLong: return reduce_span(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op);
    default: DATAPAR_INTERNAL_ASSERT(false, "not reducible: ", type);
  }
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

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& outputs) {
  int64_t offset = 0;
  for (at::Tensor& out : outputs) {
    out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
    offset += out.numel();
  }
}

}  // namespace datapar::detail::mpi
