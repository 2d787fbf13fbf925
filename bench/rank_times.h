// What the forked-rank benchmarks (dcp_bench, async_save_bench) report: medians of rounds and
// the slowest rank's time.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The slowest rank's seconds (collective over `group`).
inline double slowest(ProcessGroup& group, double seconds) {
  at::Tensor t = at::full({1}, seconds, at::kDouble);
  group.all_reduce(t, ReduceOp::kMax)->wait();
  return t.item<double>();
}

}  // namespace datapar::bench
