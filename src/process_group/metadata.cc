// See metadata.h. Values are built on the host and moved in one copy; reading back copies
// the whole tensor once instead of one item() (a device synchronisation each) per value.
#include "datapar/process_group/metadata.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "datapar/error.h"

namespace datapar {
namespace {

template <typename T>
at::Tensor from_host(const ProcessGroup& group, const std::vector<T>& values, at::ScalarType dtype) {
  at::Tensor host = at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(dtype));
  std::copy(values.begin(), values.end(), host.data_ptr<T>());
  return host.to(group.device());
}

template <typename T>
std::vector<T> to_host(const at::Tensor& tensor, at::ScalarType dtype) {
  const at::Tensor host = tensor.to(at::kCPU, dtype).contiguous();
  const T* data = host.data_ptr<T>();
  return std::vector<T>(data, data + host.numel());
}

}  // namespace

at::Tensor metadata_tensor(const ProcessGroup& group, const std::vector<int64_t>& values) {
  return from_host(group, values, at::kLong);
}

at::Tensor metadata_tensor(const ProcessGroup& group, const std::vector<double>& values) {
  return from_host(group, values, at::kDouble);
}

at::Tensor metadata_zeros(const ProcessGroup& group, int64_t count, at::ScalarType dtype) {
  return at::zeros({count}, group.options(dtype));
}

at::Tensor metadata_text(const ProcessGroup& group, const std::string& text, int64_t length) {
  DATAPAR_INTERNAL_ASSERT(length >= static_cast<int64_t>(text.size()), "metadata_text: ", text.size(),
                          " bytes do not fit in ", length);
  at::Tensor host = at::zeros({length}, at::kByte);
  std::copy(text.begin(), text.end(), host.data_ptr<uint8_t>());
  return host.to(group.device());
}

std::vector<int64_t> host_int64s(const at::Tensor& tensor) { return to_host<int64_t>(tensor, at::kLong); }

std::vector<double> host_doubles(const at::Tensor& tensor) { return to_host<double>(tensor, at::kDouble); }

std::string host_text(const at::Tensor& tensor, int64_t length) {
  const at::Tensor host = tensor.to(at::kCPU).contiguous();
  const auto* bytes = host.data_ptr<uint8_t>();
  return std::string(bytes, bytes + std::clamp<int64_t>(length, 0, host.numel()));  // a peer's length: bound it
}

}  // namespace datapar
