// scatter and gather over nested values. See scatter_gather.h.
//
// Nested inputs are walked recursively; the split sizes are decided once, from the first
// tensor, and every other tensor must agree, so chunk i of every tensor lands on devices[i]
// together. Python's DataParallel zips per-tensor chunk lists and silently drops rows when
// tensors disagree; here that is an error.
#include "datapar/parallel/scatter_gather.h"

#include <ATen/ATen.h>

#include "datapar/error.h"
#include "datapar/parallel/chunk_sizes.h"

namespace datapar {
namespace {

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what) {
  DATAPAR_CHECK(ndim > 0, what, ": cannot split a 0-dim tensor (a scalar); give tensors with a batch dimension.");
  DATAPAR_CHECK(dim >= -ndim && dim < ndim, what, ": dim ", dim, " is out of range for a tensor with ",
                ndim, " dimensions (valid: ", -ndim, " .. ", ndim - 1, ").");
  return dim < 0 ? dim + ndim : dim;
}

at::Tensor to_device(const at::Tensor& t, const Device& device) {
  const c10::Device target = device.torch_device();
  // Non-blocking only towards CUDA: a non-blocking copy to the CPU may be read before it lands.
  return t.device() == target ? t : t.to(target, /*non_blocking=*/target.is_cuda());
}

std::vector<at::Tensor> split_tensor(const at::Tensor& input, const std::vector<Device>& devices,
                                     int64_t dim, const std::vector<int64_t>& sizes) {
  const int64_t d = wrap_dim(dim, input.dim(), "scatter");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  DATAPAR_CHECK(input.size(d) == total, "scatter: a tensor has ", input.size(d), " rows along dim ", d,
                " but the batch has ", total, "; every tensor in the input must have the same ",
                "number of rows along the scatter dimension.");
  std::vector<at::Tensor> chunks;
  chunks.reserve(sizes.size());
  int64_t begin = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    chunks.push_back(to_device(input.narrow(d, begin, sizes[i]), devices[i]));
    begin += sizes[i];
  }
  return chunks;
}

std::vector<c10::IValue> split_value(const c10::IValue& value, const std::vector<Device>& devices,
                                     int64_t dim, const std::vector<int64_t>& sizes) {
  const size_t k = sizes.size();
  std::vector<c10::IValue> out(k);
  if (value.isTensor()) {
    auto chunks = split_tensor(value.toTensor(), devices, dim, sizes);
    for (size_t i = 0; i < k; ++i) out[i] = std::move(chunks[i]);
  } else if (value.isTensorList()) {
    std::vector<c10::List<at::Tensor>> lists(k);
    for (const at::Tensor& t : value.toTensorVector()) {
      auto chunks = split_tensor(t, devices, dim, sizes);
      for (size_t i = 0; i < k; ++i) lists[i].push_back(std::move(chunks[i]));
    }
    for (size_t i = 0; i < k; ++i) out[i] = std::move(lists[i]);
  } else if (value.isList()) {
    auto list = value.toList();
    // c10::List is a handle: build each chunk's list separately, never by copying one.
    std::vector<c10::impl::GenericList> lists;
    for (size_t i = 0; i < k; ++i) lists.emplace_back(list.elementType());
    for (const c10::IValue& element : list) {
      auto parts = split_value(element, devices, dim, sizes);
      for (size_t i = 0; i < k; ++i) lists[i].push_back(std::move(parts[i]));
    }
    for (size_t i = 0; i < k; ++i) out[i] = std::move(lists[i]);
  } else if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    std::vector<std::vector<c10::IValue>> tuples(k);
    for (const c10::IValue& element : elements) {
      auto parts = split_value(element, devices, dim, sizes);
      for (size_t i = 0; i < k; ++i) tuples[i].push_back(std::move(parts[i]));
    }
    for (size_t i = 0; i < k; ++i) out[i] = c10::ivalue::Tuple::create(std::move(tuples[i]));
  } else if (value.isGenericDict()) {
    auto dict = value.toGenericDict();
    std::vector<c10::impl::GenericDict> dicts;  // handles too, like the lists above
    for (size_t i = 0; i < k; ++i) dicts.emplace_back(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) {
      auto parts = split_value(entry.value(), devices, dim, sizes);
      for (size_t i = 0; i < k; ++i) dicts[i].insert(entry.key(), std::move(parts[i]));
    }
    for (size_t i = 0; i < k; ++i) out[i] = std::move(dicts[i]);
  } else {
    for (size_t i = 0; i < k; ++i) out[i] = value;  // not a tensor: every replica gets it
  }
  return out;
}

std::vector<int64_t> plan_sizes(int64_t rows, size_t num_devices, std::vector<int64_t> sizes) {
  DATAPAR_CHECK(num_devices >= 1, "scatter: no devices given; list at least one device.");
  if (sizes.empty()) return chunk_sizes(rows, static_cast<int64_t>(num_devices));
  check_chunk_sizes(sizes, rows, static_cast<int64_t>(num_devices));
  return sizes;
}

at::Tensor gather_tensors(const std::vector<at::Tensor>& parts, const Device& device, int64_t dim) {
  std::vector<at::Tensor> moved;
  moved.reserve(parts.size());
  const bool scalars = parts.front().dim() == 0;
  for (const at::Tensor& part : parts) {
    DATAPAR_CHECK(part.defined(), "gather: an output tensor is undefined.");
    DATAPAR_CHECK((part.dim() == 0) == scalars, "gather: outputs mix 0-dim and n-dim tensors at one position.");
    moved.push_back(to_device(part, device));
  }
  if (scalars) return at::stack(moved);
  const int64_t d = wrap_dim(dim, moved.front().dim(), "gather");
  if (moved.size() == 1) return moved.front();
  return at::cat(moved, d);
}

c10::IValue gather_values(const std::vector<c10::IValue>& outputs, const Device& device, int64_t dim) {
  const c10::IValue& first = outputs.front();
  for (const c10::IValue& o : outputs) {
    DATAPAR_CHECK(o.tagKind() == first.tagKind(), "gather: replica outputs differ in type (",
                  first.tagKind(), " vs ", o.tagKind(), "); every replica must return the same structure.");
  }
  if (first.isTensor()) {
    std::vector<at::Tensor> parts;
    for (const c10::IValue& o : outputs) parts.push_back(o.toTensor());
    return gather_tensors(parts, device, dim);
  }
  if (first.isTensorList()) {
    const size_t n = first.toTensorList().size();
    c10::List<at::Tensor> result;
    for (size_t j = 0; j < n; ++j) {
      std::vector<at::Tensor> parts;
      for (const c10::IValue& o : outputs) {
        auto list = o.toTensorList();
        DATAPAR_CHECK(list.size() == n, "gather: replica outputs are lists of different lengths.");
        parts.push_back(list.get(j));
      }
      result.push_back(gather_tensors(parts, device, dim));
    }
    return result;
  }
  if (first.isList() || first.isTuple()) {
    auto elements_of = [](const c10::IValue& v) {
      return v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
    };
    const size_t n = elements_of(first).size();
    std::vector<std::vector<c10::IValue>> columns(n);
    for (const c10::IValue& o : outputs) {
      auto elements = elements_of(o);
      DATAPAR_CHECK(elements.size() == n, "gather: replica outputs have different lengths (", n,
                    " vs ", elements.size(), ").");
      for (size_t j = 0; j < n; ++j) columns[j].push_back(std::move(elements[j]));
    }
    std::vector<c10::IValue> gathered;
    for (auto& column : columns) gathered.push_back(gather_values(column, device, dim));
    if (first.isTuple()) return c10::ivalue::Tuple::create(std::move(gathered));
    c10::impl::GenericList list(first.toList().elementType());
    for (auto& g : gathered) list.push_back(std::move(g));
    return list;
  }
  if (first.isGenericDict()) {
    auto dict = first.toGenericDict();
    c10::impl::GenericDict result(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) {
      std::vector<c10::IValue> column;
      for (const c10::IValue& o : outputs) {
        auto other = o.toGenericDict();
        auto it = other.find(entry.key());
        DATAPAR_CHECK(it != other.end(), "gather: a replica output lacks the key ", entry.key(), ".");
        column.push_back(it->value());
      }
      result.insert(entry.key(), gather_values(column, device, dim));
    }
    return result;
  }
  return first;
}

}  // namespace

int64_t batch_size(const c10::IValue& input, int64_t dim) {
  if (input.isTensor()) {
    const at::Tensor& t = input.toTensor();
    return t.size(wrap_dim(dim, t.dim(), "scatter"));
  }
  auto first_of = [&](const std::vector<c10::IValue>& values) -> int64_t {
    for (const c10::IValue& v : values) {
      const int64_t n = batch_size(v, dim);
      if (n >= 0) return n;
    }
    return -1;
  };
  if (input.isTensorList() || input.isList()) return first_of(input.toList().vec());
  if (input.isTuple()) return first_of(input.toTupleRef().elements().vec());
  if (input.isGenericDict()) {
    std::vector<c10::IValue> values;
    for (const auto& entry : input.toGenericDict()) values.push_back(entry.value());
    return first_of(values);
  }
  return -1;
}

std::vector<at::Tensor> scatter(const at::Tensor& input, const std::vector<Device>& devices,
                                int64_t dim, std::vector<int64_t> chunk_sizes) {
  DATAPAR_CHECK(input.defined(), "scatter: the input tensor is undefined.");
  const int64_t d = wrap_dim(dim, input.dim(), "scatter");
  return split_tensor(input, devices, d, plan_sizes(input.size(d), devices.size(), std::move(chunk_sizes)));
}

std::vector<c10::IValue> scatter(const c10::IValue& input, const std::vector<Device>& devices,
                                 int64_t dim, std::vector<int64_t> chunk_sizes) {
  const int64_t rows = batch_size(input, dim);
  DATAPAR_CHECK(rows >= 0, "scatter: the input holds no tensor to split; pass at least one tensor with a batch dimension.");
  return split_value(input, devices, dim, plan_sizes(rows, devices.size(), std::move(chunk_sizes)));
}

at::Tensor gather(const std::vector<at::Tensor>& outputs, const Device& device, int64_t dim) {
  DATAPAR_CHECK(!outputs.empty(), "gather: no outputs to gather.");
  return gather_tensors(outputs, device, dim);
}

c10::IValue gather(const std::vector<c10::IValue>& outputs, const Device& device, int64_t dim) {
  DATAPAR_CHECK(!outputs.empty(), "gather: no outputs to gather.");
  return gather_values(outputs, device, dim);
}

}  // namespace datapar
