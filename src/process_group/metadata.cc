// See metadata.h. Values are built on the host and moved in one copy; reading back copies
// the whole tensor once instead of one item() (a device synchronisation each) per value.
#include "datapar/process_group/metadata.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>

#include "datapar/error.h"

namespace datapar {
namespace {

std::atomic<int64_t> host_reads{0};

// A host tensor for values bound for `device`: page-locked when that is a GPU, so that the
// copy there can be non-blocking (from pageable memory it would wait for the stream). The
// caching host allocator reuses the block only once the copy that read it has run.
at::Tensor staging_tensor(const c10::Device& device, int64_t count, at::ScalarType dtype) {
  return at::empty({count}, at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda()));
}

at::Tensor to_group_device(const ProcessGroup& group, const at::Tensor& host) {
  return host.to(group.device(), host.scalar_type(), /*non_blocking=*/true);
}

template <typename T>
at::Tensor from_host(const ProcessGroup& group, const std::vector<T>& values, at::ScalarType dtype) {
  at::Tensor host = staging_tensor(group.device(), static_cast<int64_t>(values.size()), dtype);
  std::copy(values.begin(), values.end(), host.data_ptr<T>());
  return to_group_device(group, host);
}

template <typename T>
std::vector<T> to_host(const at::Tensor& tensor, at::ScalarType dtype) {
  ++host_reads;
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
  at::Tensor host = staging_tensor(group.device(), length, at::kByte);
  std::fill(std::copy(text.begin(), text.end(), host.data_ptr<uint8_t>()), host.data_ptr<uint8_t>() + length, 0);
  return to_group_device(group, host);
}

std::vector<int64_t> host_int64s(const at::Tensor& tensor) { return to_host<int64_t>(tensor, at::kLong); }

std::vector<double> host_doubles(const at::Tensor& tensor) { return to_host<double>(tensor, at::kDouble); }

std::string host_text(const at::Tensor& tensor, int64_t length) {
  ++host_reads;
  const at::Tensor host = tensor.to(at::kCPU).contiguous();
  const auto* bytes = host.data_ptr<uint8_t>();
  return std::string(bytes, bytes + std::clamp<int64_t>(length, 0, host.numel()));  // a peer's length: bound it
}

std::vector<std::string> all_gather_bytes(ProcessGroup& group, const std::string& bytes) {
  const int n = group.size();
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < n; ++r) lengths.push_back(metadata_zeros(group, 1, at::kLong));
  group.all_gather(lengths, metadata_tensor(group, std::vector<int64_t>{static_cast<int64_t>(bytes.size())}))->wait();
  std::vector<int64_t> sizes;
  int64_t longest = 1;  // no empty tensor in a collective
  for (const at::Tensor& l : lengths) {
    sizes.push_back(host_int64s(l).at(0));
    DATAPAR_CHECK(sizes.back() >= 0, "all_gather_bytes: a rank sent a length of ", sizes.back(), ".");
    longest = std::max(longest, sizes.back());
  }
  std::vector<at::Tensor> all;
  for (int r = 0; r < n; ++r) all.push_back(metadata_zeros(group, longest, at::kByte));
  group.all_gather(all, metadata_text(group, bytes, longest))->wait();
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(host_text(all[r], sizes[r]));
  return out;
}

std::string broadcast_bytes(ProcessGroup& group, int root, const std::string& bytes) {
  const bool mine = group.rank() == root;
  at::Tensor length = metadata_tensor(group, std::vector<int64_t>{mine ? static_cast<int64_t>(bytes.size()) : 0});
  group.broadcast(length, root)->wait();
  const int64_t n = host_int64s(length).at(0);
  DATAPAR_CHECK(n >= 0, "broadcast_bytes: rank ", root, " sent a length of ", n, ".");
  at::Tensor text = mine ? metadata_text(group, bytes, std::max<int64_t>(n, 1))
                         : metadata_zeros(group, std::max<int64_t>(n, 1), at::kByte);
  group.broadcast(text, root)->wait();
  return mine ? bytes : host_text(text, n);
}

namespace detail {

int64_t metadata_host_reads() { return host_reads.load(); }

}  // namespace detail

}  // namespace datapar
