#include "ddp/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

namespace datapar::detail {

std::vector<BucketIndices> assign_buckets(const std::vector<at::Tensor>& params, const std::vector<size_t>& order,
                                          int64_t first_cap_bytes, int64_t cap_bytes) {
  // One open bucket per (dtype, device), as parameters of several kinds interleave.
  using Kind = std::tuple<int, int, int>;  // dtype, device type, device index
  std::map<Kind, std::pair<BucketIndices, int64_t>> open;  // kind -> (bucket, bytes)
  std::vector<std::pair<size_t, BucketIndices>> closed;  // (position of first member, bucket)
  std::map<size_t, size_t> first_position;  // param -> its position in order
  for (size_t pos = 0; pos < order.size(); ++pos) first_position[order[pos]] = pos;

  auto close = [&](BucketIndices& bucket) {
    if (bucket.empty()) return;
    closed.emplace_back(first_position.at(bucket.front()), std::move(bucket));
    bucket.clear();
  };
  for (size_t i : order) {
    const at::Tensor& p = params.at(i);
    const Kind kind{static_cast<int>(p.scalar_type()), static_cast<int>(p.device().type()), p.device().index()};
    auto& [bucket, bytes] = open[kind];
    bucket.push_back(i);
    bytes += static_cast<int64_t>(p.numel()) * static_cast<int64_t>(p.element_size());
    const int64_t cap = closed.empty() ? first_cap_bytes : cap_bytes;
    if (bytes >= cap) {
      close(bucket);
      bytes = 0;
    }
  }
  for (auto& [kind, entry] : open) close(entry.first);
  std::sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<BucketIndices> buckets;
  for (auto& entry : closed) buckets.push_back(std::move(entry.second));
  return buckets;
}

std::vector<size_t> reverse_order(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.rbegin(), order.rend(), size_t{0});
  return order;
}

}  // namespace datapar::detail
