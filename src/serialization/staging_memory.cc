// Host copies of tensors, reused between saves. See staging_memory.h.
#include "serialization/staging_memory.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace datapar::detail {

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
  buffer.copy_(t.detach());
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
