// Split rules for scatter. See chunk_sizes.h.
#include "datapar/parallel/chunk_sizes.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "datapar/error.h"

namespace datapar {

std::vector<int64_t> chunk_sizes(int64_t n, int64_t num_chunks) {
  DATAPAR_CHECK(n >= 1, "scatter: cannot split ", n,
                " rows; the batch must have at least one row along the scatter dimension.");
  DATAPAR_CHECK(num_chunks >= 1, "scatter: cannot split into ", num_chunks,
                " chunks; give at least one device.");
  const int64_t size = (n + num_chunks - 1) / num_chunks;  // ceil(n / k), as torch.chunk
  std::vector<int64_t> sizes;
  for (int64_t begin = 0; begin < n; begin += size) sizes.push_back(std::min(size, n - begin));
  return sizes;
}

std::vector<int64_t> weighted_chunk_sizes(int64_t n, const std::vector<double>& weights) {
  DATAPAR_CHECK(n >= 1, "scatter: cannot split ", n, " rows; the batch must have at least one row.");
  DATAPAR_CHECK(!weights.empty(), "scatter: no device weights given; give one weight per device.");
  double total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    DATAPAR_CHECK(std::isfinite(weights[i]) && weights[i] >= 0, "scatter: device weight ", i,
                  " is ", weights[i], "; weights must be finite and >= 0.");
    total += weights[i];
  }
  DATAPAR_CHECK(total > 0, "scatter: every device weight is 0; give at least one a positive weight.");
  const int64_t k = static_cast<int64_t>(weights.size());

  // Too few rows for every device: like torch.chunk, the first n devices get one row each.
  if (n < k) return std::vector<int64_t>(static_cast<size_t>(n), 1);

  // Everyone gets one row, then the rest is shared by largest remainder (ties: first device).
  const int64_t rest = n - k;
  std::vector<int64_t> sizes(weights.size());
  std::vector<double> remainder(weights.size());
  int64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double exact = static_cast<double>(rest) * weights[i] / total;
    sizes[i] = 1 + static_cast<int64_t>(std::floor(exact));
    remainder[i] = exact - std::floor(exact);
    given += sizes[i] - 1;
  }
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (int64_t i = 0; given < rest; ++i, ++given) sizes[order[i % k]] += 1;
  return sizes;
}

void check_chunk_sizes(const std::vector<int64_t>& sizes, int64_t n, int64_t num_devices) {
  DATAPAR_CHECK(!sizes.empty(), "scatter: chunk_sizes is empty; give one size per device.");
  DATAPAR_CHECK(static_cast<int64_t>(sizes.size()) <= num_devices, "scatter: ", sizes.size(),
                " chunk sizes for ", num_devices, " devices; give at most one size per device.");
  int64_t sum = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    DATAPAR_CHECK(sizes[i] >= 1, "scatter: chunk size ", i, " is ", sizes[i],
                  "; every chunk needs at least one row (list fewer devices instead).");
    sum += sizes[i];
  }
  DATAPAR_CHECK(sum == n, "scatter: chunk sizes add up to ", sum, " but the input has ", n,
                " rows along the scatter dimension. Make them sum to ", n, ".");
}

}  // namespace datapar
