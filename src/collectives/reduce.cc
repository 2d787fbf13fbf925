// See reduce.h and datapar/reduce_op.h.
#include "collectives/reduce.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "datapar/error.h"

namespace datapar {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "?";
}

namespace detail {
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

void reduce_into(void* dst, const void* src, int64_t n, at::ScalarType type, ReduceOp op) {
  switch (type) {
    case at::kFloat: return reduce_span(static_cast<float*>(dst), static_cast<const float*>(src), n, op);
    case at::kDouble: return reduce_span(static_cast<double*>(dst), static_cast<const double*>(src), n, op);
    case at::kInt: return reduce_span(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op);
    case at::kLong: return reduce_span(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op);
    default: DATAPAR_INTERNAL_ASSERT(false, "not reducible: ", type);
  }
}

}  // namespace detail
}  // namespace datapar
