// See reduce.h and datapar/reduce_op.h.
#include "collectives/reduce.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "datapar/error.h"

// AddressSanitizer, as clang and gcc each say it.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DATAPAR_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(DATAPAR_ASAN)
#define DATAPAR_ASAN 1
#endif
#ifndef DATAPAR_ASAN
#define DATAPAR_ASAN 0
#endif
#if DATAPAR_ASAN
#include <sanitizer/asan_interface.h>
#endif

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

// The element-wise loops, once for both functions below.
#define DATAPAR_REDUCE_LOOPS                                                    \
  switch (op) {                                                                 \
    case ReduceOp::kSum:                                                        \
    case ReduceOp::kAvg:                                                        \
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];                         \
      return;                                                                   \
    case ReduceOp::kProduct:                                                    \
      for (int64_t i = 0; i < n; ++i) dst[i] *= src[i];                         \
      return;                                                                   \
    case ReduceOp::kMin:                                                        \
      for (int64_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);        \
      return;                                                                   \
    case ReduceOp::kMax:                                                        \
      for (int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);        \
      return;                                                                   \
  }

template <typename T>
void reduce_span(T* __restrict dst, const T* __restrict src, int64_t n, ReduceOp op) {
  DATAPAR_REDUCE_LOOPS
}

#if DATAPAR_ASAN
// Note [A span checked whole]: under AddressSanitizer every element's load and store in the
// loops above is checked and the loops are not vectorized (with the fuzzers' coverage
// counters besides, 7% of the CPU of an HSDP run on shared memory went there). Both spans
// are checked whole instead, and the loops run uninstrumented; a span that is not all
// addressable takes the instrumented loops, so that ASan reports the first bad element.
#if defined(__clang__)
#define DATAPAR_UNINSTRUMENTED __attribute__((no_sanitize("address", "coverage")))
#else
#define DATAPAR_UNINSTRUMENTED __attribute__((no_sanitize_address))
#endif
template <typename T>
DATAPAR_UNINSTRUMENTED void reduce_span_uninstrumented(T* __restrict dst, const T* __restrict src, int64_t n,
                                                       ReduceOp op) {
  DATAPAR_REDUCE_LOOPS
}
#undef DATAPAR_UNINSTRUMENTED
#endif

// reduce_span, its spans checked whole under ASan (Note [A span checked whole]).
template <typename T>
void reduce_elements(T* dst, const T* src, int64_t n, ReduceOp op) {
#if DATAPAR_ASAN
  const size_t bytes = static_cast<size_t>(n) * sizeof(T);
  if (n > 0 && __asan_region_is_poisoned(dst, bytes) == nullptr &&
      __asan_region_is_poisoned(const_cast<T*>(src), bytes) == nullptr) {
    return reduce_span_uninstrumented(dst, src, n, op);
  }
#endif
  reduce_span(dst, src, n, op);
}

#undef DATAPAR_REDUCE_LOOPS

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
    case at::kFloat: return reduce_elements(static_cast<float*>(dst), static_cast<const float*>(src), n, op);
    case at::kDouble: return reduce_elements(static_cast<double*>(dst), static_cast<const double*>(src), n, op);
    case at::kInt: return reduce_elements(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op);
    case at::kLong: return reduce_elements(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op);
    default: DATAPAR_INTERNAL_ASSERT(false, "not reducible: ", type);
  }
}

}  // namespace detail
}  // namespace datapar

#undef DATAPAR_ASAN
