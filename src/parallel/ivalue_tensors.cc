// See ivalue_tensors.h.
#include "parallel/ivalue_tensors.h"

namespace datapar::detail {

void collect_tensors(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector()) out.push_back(t);
  } else if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) collect_tensors(v, out);
  } else if (value.isTuple()) {
    for (const c10::IValue& v : value.toTupleRef().elements()) collect_tensors(v, out);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) collect_tensors(entry.value(), out);
  }
}

c10::IValue map_tensors(const c10::IValue& value, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (value.isTensor()) return fn(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorVector()) list.push_back(fn(t));
    return list;
  }
  if (value.isList()) {
    auto source = value.toList();
    c10::impl::GenericList list(source.elementType());
    for (const c10::IValue& v : source) list.push_back(map_tensors(v, fn));
    return list;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& v : value.toTupleRef().elements()) elements.push_back(map_tensors(v, fn));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (value.isGenericDict()) {
    auto source = value.toGenericDict();
    c10::impl::GenericDict dict(source.keyType(), source.valueType());
    for (const auto& entry : source) dict.insert(entry.key(), map_tensors(entry.value(), fn));
    return dict;
  }
  return value;
}

}  // namespace datapar::detail
