#include "datapar/parallel/load_balancer.h"

#include <algorithm>
#include <cmath>

#include "datapar/error.h"

namespace datapar {
namespace {

double median(std::deque<double> values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return (*std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

bool takes_part(const LoadBalancerOptions& options, size_t i) {
  return !options.takes_part.empty() && options.takes_part[i];
}

// The step's length under the model (fixed + per_row x rows): its latest finishing device.
// A device with no share takes no time, unless it runs a row anyway.
double predicted_step(const std::vector<double>& weights, double n, const std::vector<double>& fixed,
                      const std::vector<double>& per_row, const LoadBalancerOptions& options) {
  double longest = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] > 0) {
      longest = std::max(longest, fixed[i] + per_row[i] * weights[i] * n);
    } else if (takes_part(options, i)) {
      longest = std::max(longest, fixed[i] + per_row[i]);
    }
  }
  return longest;
}

// The shares of n rows under which every device that gets some finishes at one time T, and
// a device whose fixed cost is T or more gets none (Note [Fixed cost per step]). Devices
// with per_row 0 (never measured) get none. Devices join in order of fixed cost, while
// their fixed cost is below the T of those before them.
std::vector<double> water_filling(double n, const std::vector<double>& fixed, const std::vector<double>& per_row) {
  std::vector<size_t> order;
  for (size_t i = 0; i < fixed.size(); ++i) {
    if (per_row[i] > 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return fixed[x] < fixed[y]; });
  double inverse_sum = 0;   // sum of 1 / per_row over the devices in
  double weighted_sum = 0;  // sum of fixed / per_row over them
  double finish = 0;
  size_t in = 0;
  for (; in < order.size(); ++in) {
    const size_t i = order[in];
    if (in > 0 && fixed[i] >= finish) break;
    inverse_sum += 1 / per_row[i];
    weighted_sum += fixed[i] / per_row[i];
    finish = (n + weighted_sum) / inverse_sum;
  }
  std::vector<double> shares(fixed.size(), 0.0);
  for (size_t k = 0; k < in; ++k) {
    const size_t i = order[k];
    shares[i] = std::max(0.0, (finish - fixed[i]) / per_row[i]) / n;
  }
  return shares;
}

}  // namespace

LoadBalancer::LoadBalancer(size_t devices, LoadBalancerOptions options, std::vector<double> initial_weights)
    : options_(options),
      costs_(devices),
      points_(devices),
      fixed_(devices, 0.0),
      per_row_(devices, 0.0),
      latest_(devices, 0.0),
      last_move_(devices, 0.0),
      left_out_since_(devices, -1) {
  DATAPAR_CHECK(devices >= 1, "LoadBalancer: no devices; give at least one.");
  DATAPAR_CHECK(options.window >= 1, "LoadBalancer: window is ", options.window, "; it must be >= 1.");
  DATAPAR_CHECK(options.min_steps >= 1 && options.min_steps <= options.window, "LoadBalancer: min_steps is ",
                options.min_steps, "; it must be between 1 and the window (", options.window, ").");
  DATAPAR_CHECK(options.skip_steps >= 0, "LoadBalancer: skip_steps is ", options.skip_steps, "; it must be >= 0.");
  DATAPAR_CHECK(std::isfinite(options.hysteresis) && options.hysteresis >= 0, "LoadBalancer: hysteresis is ",
                options.hysteresis, "; it must be a fraction >= 0 (0.1 = 10%).");
  DATAPAR_CHECK(std::isfinite(options.min_move) && options.min_move >= 0 && options.min_move < 1,
                "LoadBalancer: min_move is ", options.min_move, "; it must be a fraction in [0, 1) (0.01 = 1%).");
  DATAPAR_CHECK(options.probe_every >= 0, "LoadBalancer: probe_every is ", options.probe_every,
                "; it must be >= 0 (0: never).");
  DATAPAR_CHECK(options.takes_part.empty() || options.takes_part.size() == devices, "LoadBalancer: takes_part has ",
                options.takes_part.size(), " entries for ", devices, " devices; give one per device or none.");
  if (initial_weights.empty()) initial_weights.assign(devices, 1.0);
  DATAPAR_CHECK(initial_weights.size() == devices, "LoadBalancer: ", initial_weights.size(), " weights for ", devices,
                " devices; give one weight per device.");
  double total = 0;
  for (double w : initial_weights) {
    DATAPAR_CHECK(std::isfinite(w) && w >= 0, "LoadBalancer: weight ", w, " is not a finite number >= 0.");
    total += w;
  }
  DATAPAR_CHECK(total > 0, "LoadBalancer: every weight is 0; give some device a share.");
  for (double& w : initial_weights) w /= total;
  weights_ = std::move(initial_weights);
}

bool LoadBalancer::record(const std::vector<int64_t>& rows, const std::vector<double>& seconds) {
  const size_t n = weights_.size();
  DATAPAR_CHECK(rows.size() == n && seconds.size() == n, "LoadBalancer::record: ", rows.size(), " row counts and ",
                seconds.size(), " times for ", n, " devices; give one of each per device.");
  for (size_t i = 0; i < n; ++i) {
    DATAPAR_CHECK(rows[i] >= 0, "LoadBalancer::record: device ", i, " ran ", rows[i], " rows.");
    DATAPAR_CHECK(std::isfinite(seconds[i]) && seconds[i] >= 0, "LoadBalancer::record: device ", i, " took ",
                  seconds[i], " s.");
  }
  if (recorded_++ < options_.skip_steps) return false;
  int64_t batch = 0;
  for (size_t i = 0; i < n; ++i) {
    batch += rows[i];
    if (rows[i] == 0) continue;
    std::deque<double>& window = costs_[i];
    window.push_back(seconds[i] / static_cast<double>(rows[i]));
    if (static_cast<int64_t>(window.size()) > options_.window) window.pop_front();
    latest_[i] = median(window);

    std::vector<Point>& points = points_[i];
    auto at = std::find_if(points.begin(), points.end(), [&](const Point& p) { return p.rows == rows[i]; });
    if (at == points.end()) {
      if (points.size() == kPoints) points.pop_back();
      points.insert(points.begin(), Point{rows[i], {}});
    } else {
      std::rotate(points.begin(), at, at + 1);  // most recent first
    }
    points.front().seconds.push_back(seconds[i]);
    if (static_cast<int64_t>(points.front().seconds.size()) > options_.window) points.front().seconds.pop_front();
  }
  batch_rows_ = std::max(batch_rows_, batch);
  // Devices that take part must be measured under the current split; one left out keeps the
  // model that left it out.
  for (size_t i = 0; i < n; ++i) {
    const bool runs = weights_[i] > 0 || takes_part(options_, i);
    if (runs && static_cast<int64_t>(costs_[i].size()) < options_.min_steps) return false;
  }
  if (n == 1) return false;
  for (size_t i = 0; i < n; ++i) {
    if (!points_[i].empty()) fit(i);
  }
  // A device measured as taking no time at all would get everything; its cost per row is
  // floored at a millionth of the slowest's.
  const double slowest = *std::max_element(per_row_.begin(), per_row_.end());
  if (slowest <= 0) return false;
  for (size_t i = 0; i < n; ++i) {
    if (per_row_[i] > 0 || weights_[i] > 0) per_row_[i] = std::max(per_row_[i], slowest * 1e-6);
  }
  const double rows_per_step = static_cast<double>(batch_rows_);
  std::vector<double> balanced = water_filling(rows_per_step, fixed_, per_row_);
  // A device left out `probe_every` steps ago is measured again: it gets the share seconds per
  // row alone would give it.
  bool probe = false;
  for (size_t i = 0; i < n; ++i) {
    probe = probe || (left_out_since_[i] >= 0 && options_.probe_every > 0 &&
                      recorded_ - left_out_since_[i] >= options_.probe_every);
  }
  if (probe) {
    std::vector<double> fixed = fixed_;
    for (size_t i = 0; i < n; ++i) {
      if (left_out_since_[i] >= 0) fixed[i] = 0;
    }
    balanced = water_filling(rows_per_step, fixed, per_row_);
  } else if (predicted_step(weights_, rows_per_step, fixed_, per_row_, options_) <=
             predicted_step(balanced, rows_per_step, fixed_, per_row_, options_) * (1 + options_.hysteresis)) {
    return false;
  }
  bool regrouped = false;  // a device left out or taken back in
  for (size_t i = 0; i < n; ++i) regrouped = regrouped || (weights_[i] > 0) != (balanced[i] > 0);
  std::vector<double> move(n);
  double along = 0;
  for (size_t i = 0; i < n; ++i) {
    move[i] = balanced[i] - weights_[i];
    along += move[i] * last_move_[i];
  }
  // Note [Halfway back]: a move against the previous one goes half as far as that one did.
  const double scale = along < 0 && !regrouped ? move_scale_ / 2 : 1.0;
  double largest = 0;
  for (double& m : move) {
    m *= scale;
    largest = std::max(largest, std::abs(m));
  }
  if (largest < options_.min_move && !regrouped) return false;  // within the measurements' noise
  for (size_t i = 0; i < n; ++i) {
    weights_[i] = regrouped ? balanced[i] : weights_[i] + move[i];
    if (weights_[i] > 0 || takes_part(options_, i)) {  // the row it runs measures it: never probed
      left_out_since_[i] = -1;
    } else if (left_out_since_[i] < 0) {
      left_out_since_[i] = recorded_;
    }
  }
  move_scale_ = scale;
  last_move_ = std::move(move);
  ++rebalances_;
  for (auto& window : costs_) window.clear();
  return true;
}

void LoadBalancer::fit(size_t i) {
  fixed_[i] = 0;
  per_row_[i] = latest_[i];
  const auto measured = [&](const Point& p) { return static_cast<int64_t>(p.seconds.size()) >= options_.min_steps; };
  const std::vector<Point>& points = points_[i];
  const auto current = std::find_if(points.begin(), points.end(), measured);
  if (current == points.end()) return;
  const auto apart = [&](const Point& p) {
    return measured(p) && std::abs(p.rows - current->rows) * 4 >= std::max(p.rows, current->rows);
  };
  auto farthest = points.end();
  for (auto p = points.begin(); p != points.end(); ++p) {
    if (p == current || !apart(*p)) continue;
    if (farthest == points.end() || std::abs(p->rows - current->rows) > std::abs(farthest->rows - current->rows)) {
      farthest = p;
    }
  }
  if (farthest == points.end()) return;
  const double t1 = median(current->seconds);
  const double t0 = median(farthest->seconds);
  const double rows1 = static_cast<double>(current->rows);
  const double slope = (t1 - t0) / (rows1 - static_cast<double>(farthest->rows));
  if (!(slope > 0)) {  // the time does not grow with the rows: all of it is fixed
    fixed_[i] = t1;
    per_row_[i] = t1 / rows1 * 1e-3;
    return;
  }
  const double intercept = t1 - slope * rows1;
  if (!(intercept > 0)) return;  // slower per row at more rows: per row alone
  fixed_[i] = intercept;
  per_row_[i] = slope;
}

}  // namespace datapar
