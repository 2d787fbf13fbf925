// Stragglers named. See datapar/train/stragglers.h.
#include "datapar/train/stragglers.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "datapar/error.h"

namespace datapar::train {

StragglerMeter::StragglerMeter(int64_t window, double threshold) : window_(window), threshold_(threshold) {
  DATAPAR_CHECK(window >= 1, "StragglerMeter: the window must hold at least 1 step, not ", window, ".");
  DATAPAR_CHECK(threshold > 1, "StragglerMeter: the threshold must be above 1, not ", threshold, ".");
}

void StragglerMeter::step(double seconds, double waited_seconds) {
  steps_.emplace_back(seconds, std::clamp(waited_seconds, 0.0, seconds));
  if (static_cast<int64_t>(steps_.size()) > window_) steps_.pop_front();
}

StragglerReport StragglerMeter::report(ProcessGroup& group) const {
  const int n = group.size(), me = group.rank();
  double seconds = 0, waited = 0;
  for (const auto& [s, w] : steps_) {
    seconds += s;
    waited += w;
  }
  const double steps = std::max<double>(1, static_cast<double>(steps_.size()));
  // Each rank fills its own two slots: the sum over ranks is every rank's figures.
  at::Tensor all = at::zeros({2 * n}, at::kDouble);
  all[2 * me] = (seconds - waited) / steps;
  all[2 * me + 1] = seconds > 0 ? waited / seconds : 0.0;
  group.all_reduce(all, ReduceOp::kSum)->wait();
  const auto a = all.accessor<double, 1>();
  StragglerReport r;
  for (int k = 0; k < n; ++k) {
    r.work_seconds.push_back(a[2 * k]);
    r.wait_share.push_back(a[2 * k + 1]);
  }
  for (int k = 0; k < n; ++k) {
    std::vector<double> others;
    for (int j = 0; j < n; ++j) {
      if (j != k) others.push_back(r.work_seconds[j]);
    }
    double median = r.work_seconds[k];
    if (!others.empty()) {
      std::sort(others.begin(), others.end());
      const size_t m = others.size();
      median = m % 2 ? others[m / 2] : (others[m / 2 - 1] + others[m / 2]) / 2;
    }
    r.scores.push_back(median > 0 ? r.work_seconds[k] / median : 1.0);
  }
  const auto slowest = std::max_element(r.scores.begin(), r.scores.end());
  if (n > 1 && *slowest >= threshold_) r.straggler = static_cast<int>(slowest - r.scores.begin());
  return r;
}

}  // namespace datapar::train
